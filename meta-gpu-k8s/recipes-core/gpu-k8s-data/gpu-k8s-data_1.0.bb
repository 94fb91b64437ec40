SUMMARY = "Keeps docker, k3s and node identity on the data partition across A/B updates"
DESCRIPTION = "A oneshot unit that binds /data/gpu-k8s/<name> over each path of persist.list \
(docker, containerd, k3s, the kubelet, the node password, our own state, local network \
settings) before they start, seeding each from the image on first boot, and links the files \
that provision or identify the node (k3s config.yaml and token, /etc/default settings, the \
plugin's config, SSH host keys) to their copies in /data/gpu-k8s/node-config; containerd, \
docker and k3s require it. Before /data is mounted, a second unit checks the data partition, \
repairs it and, when it is lost, makes a new one, so a damaged /data never stops a boot."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - no upstream source: our own scripts, MIT
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://gpu-k8s-data.sh \
           file://gpu-k8s-data.service \
           file://persist.list \
           file://node-config.list \
           file://10-gpu-k8s-data.conf \
           file://gpu-k8s-data-check.sh \
           file://gpu-k8s-data-check.service \
"

S = "${UNPACKDIR}"

inherit allarch systemd

GPU_K8S_DATA_REQUIRED_BY = "containerd.service docker.service k3s.service k3s-agent.service"

do_install() {
    install -d ${D}${libexecdir} ${D}${datadir}/gpu-k8s ${D}${systemd_system_unitdir}
    install -m 0755 ${UNPACKDIR}/gpu-k8s-data.sh ${D}${libexecdir}/gpu-k8s-data
    install -m 0644 ${UNPACKDIR}/persist.list ${UNPACKDIR}/node-config.list ${D}${datadir}/gpu-k8s/
    install -m 0755 ${UNPACKDIR}/gpu-k8s-data-check.sh ${D}${libexecdir}/gpu-k8s-data-check
    install -m 0644 ${UNPACKDIR}/gpu-k8s-data.service ${UNPACKDIR}/gpu-k8s-data-check.service \
        ${D}${systemd_system_unitdir}/
    sed -i -e 's#@DATADIR@#${datadir}#g' ${D}${libexecdir}/gpu-k8s-data \
        ${D}${systemd_system_unitdir}/gpu-k8s-data.service ${D}${systemd_system_unitdir}/gpu-k8s-data-check.service
    sed -i -e 's#@LIBEXECDIR@#${libexecdir}#g' -e 's#@SYSCONFDIR@#${sysconfdir}#g' \
        -e 's#@MENDER_FIRSTBOOT_UNITS@#${GPU_K8S_MENDER_FIRSTBOOT_UNITS}#g' \
        ${D}${systemd_system_unitdir}/gpu-k8s-data.service ${D}${systemd_system_unitdir}/gpu-k8s-data-check.service
    for unit in ${GPU_K8S_DATA_REQUIRED_BY}; do
        install -d ${D}${systemd_system_unitdir}/$unit.d
        install -m 0644 ${UNPACKDIR}/10-gpu-k8s-data.conf ${D}${systemd_system_unitdir}/$unit.d/
    done
}

FILES:${PN} += "${datadir}/gpu-k8s ${systemd_system_unitdir}"

SYSTEMD_SERVICE:${PN} = "gpu-k8s-data.service"

# gpu-k8s-data-check: e2fsck and mke2fs (the data partition is ext4, as meta-mender makes it),
# util-linux's blkid, which tells another kind of file system from none (busybox's cannot).
RDEPENDS:${PN} = "e2fsprogs-e2fsck e2fsprogs-mke2fs util-linux-blkid"
