# Inherited by our tegra-rootfs-update-module bbappend (dynamic-layers/mender-tegra) only with
# the A/B class. Under meta-mender-tegra's native scheme a new slot is marked good (`nvbootctrl
# verify`) by the update module's ArtifactCommit, which the update agent's health gate runs
# (`mender-update commit`), and at boot by tegra-rootfs-verify.service, which stands down while
# the pending marker on /data names the running slot; meta-tegra's nv_update_verifier.service,
# which verifies unconditionally, is left disabled. The drop-ins close what is left open: the
# verifier racing setup-nv-boot-control.service (whose config nvbootctrl reads) or reading the
# marker before /data's mount is settled, a /data that cannot mount leaving the slot
# unverified, and nv_update_verifier started anyway.
SRC_URI += "file://50-gpu-k8s-verify-order.conf \
            file://50-gpu-k8s-marker-aware.conf \
"

do_install:append() {
    install -d ${D}${systemd_system_unitdir}/tegra-rootfs-verify.service.d \
        ${D}${systemd_system_unitdir}/nv_update_verifier.service.d
    install -m 0644 ${UNPACKDIR}/50-gpu-k8s-verify-order.conf \
        ${D}${systemd_system_unitdir}/tegra-rootfs-verify.service.d/
    install -m 0644 ${UNPACKDIR}/50-gpu-k8s-marker-aware.conf \
        ${D}${systemd_system_unitdir}/nv_update_verifier.service.d/
}

FILES:${PN} += "${systemd_system_unitdir}/tegra-rootfs-verify.service.d \
                ${systemd_system_unitdir}/nv_update_verifier.service.d \
"
