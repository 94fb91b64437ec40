SUMMARY = "Boot-time CDI spec of the node's NVIDIA GPUs (x86-64 discrete GPUs)"
DESCRIPTION = "A systemd unit, started at boot and by udev when an NVIDIA GPU appears, that \
loads the NVIDIA driver, creates the /dev/nvidia* nodes and writes /var/run/cdi/nvidia.yaml \
with nvidia-ctk cdi generate, again only when the driver, toolkit or GPU list changed. On a \
box without a usable NVIDIA GPU it logs one line and the node runs without GPUs."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - no upstream source: our own script and units, MIT
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://gpu-k8s-nvidia-cdi \
           file://gpu-k8s-nvidia-cdi.service \
           file://71-gpu-k8s-nvidia.rules \
"

S = "${UNPACKDIR}"

inherit systemd gpu_k8s_nvidia

# It runs the driver's tools (nvidia-driver-tools): where the driver's licence is not accepted
# that recipe is skipped, so this one is too, with the reason, instead of leaving a world build
# with nothing to RPROVIDE them (yocto-check-layer's test_world).
# nooelint: oelint.task.noanonpython - skipped together with the driver it needs
python __anonymous() {
    if not gpu_k8s_nvidia_licence_accepted(d):
        raise bb.parse.SkipRecipe('needs nvidia-driver, whose licence is not accepted '
                                  '(LICENSE_FLAGS_ACCEPTED += "nvidia-driver", kas/include/nvidia-licence.yml)')
}

# The driver and toolkit it drives exist for x86-64 only.
COMPATIBLE_HOST = "x86_64.*-linux"

do_install() {
    install -d ${D}${libexecdir}/gpu-k8s ${D}${systemd_system_unitdir} ${D}${nonarch_base_libdir}/udev/rules.d
    install -m 0755 ${UNPACKDIR}/gpu-k8s-nvidia-cdi ${D}${libexecdir}/gpu-k8s/
    install -m 0644 ${UNPACKDIR}/gpu-k8s-nvidia-cdi.service ${D}${systemd_system_unitdir}/
    sed -i -e 's#@LIBEXECDIR@#${libexecdir}#g' ${D}${systemd_system_unitdir}/gpu-k8s-nvidia-cdi.service
    install -m 0644 ${UNPACKDIR}/71-gpu-k8s-nvidia.rules ${D}${nonarch_base_libdir}/udev/rules.d/
}

FILES:${PN} += "${nonarch_base_libdir}/udev/rules.d"

SYSTEMD_SERVICE:${PN} = "gpu-k8s-nvidia-cdi.service"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"

# nvidia-ctk (CDI spec, control device nodes), nvidia-smi and nvidia-modprobe (GPU and MIG
# capability nodes), modprobe.
RDEPENDS:${PN} = "kmod nvidia-container-toolkit nvidia-driver-tools"
