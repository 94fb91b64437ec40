# Inherited by our nvidia-docker bbappend only when DISTRO_FEATURES has "gpu-k8s".
# /etc/docker/daemon.json belongs to gpu-k8s-docker-config (nvidia as the default runtime);
# drop this recipe's copy so both packages can be installed together.
do_install:append() {
    rm -f ${D}${sysconfdir}/docker/daemon.json
    rmdir --ignore-fail-on-non-empty ${D}${sysconfdir}/docker
}
