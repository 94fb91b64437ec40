SUMMARY = "Device nodes of NVIDIA's open GPU driver for containers on Jetson Thor"
DESCRIPTION = "A boot unit, ordered before docker, k3s and the GPU device plugin, that loads \
nvidia-uvm and makes /dev/nvidia<N>, /dev/nvidiactl, /dev/nvidia-modeset, /dev/nvidia-uvm and \
/dev/nvidia-uvm-tools from the majors in /proc/devices: Thor's iGPU runs on NVIDIA's open kernel \
driver, which makes no nodes of its own, and the container runtime's CSV mode passes only nodes \
that exist when a container starts."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - no upstream source: our own script and units, MIT
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://gpu-k8s-nvidia-nodes \
           file://gpu-k8s-nvidia-nodes.service \
           file://71-gpu-k8s-nvidia-nodes.rules \
"

S = "${UNPACKDIR}"

inherit systemd

# Thor only (classes/gpu_k8s_platform.bbclass, GPU_K8S_NVIDIA_NODES_PACKAGE): the Orin's nvgpu
# and the Nano's driver make their own nodes.
COMPATIBLE_MACHINE = "(tegra264)"
PACKAGE_ARCH = "${MACHINE_ARCH}"

do_install() {
    install -d ${D}${libexecdir}/gpu-k8s ${D}${systemd_system_unitdir} ${D}${nonarch_base_libdir}/udev/rules.d
    install -m 0755 ${UNPACKDIR}/gpu-k8s-nvidia-nodes ${D}${libexecdir}/gpu-k8s/
    install -m 0644 ${UNPACKDIR}/gpu-k8s-nvidia-nodes.service ${D}${systemd_system_unitdir}/
    sed -i -e 's#@LIBEXECDIR@#${libexecdir}#g' ${D}${systemd_system_unitdir}/gpu-k8s-nvidia-nodes.service
    install -m 0644 ${UNPACKDIR}/71-gpu-k8s-nvidia-nodes.rules ${D}${nonarch_base_libdir}/udev/rules.d/
}

FILES:${PN} += "${nonarch_base_libdir}/udev/rules.d"

SYSTEMD_SERVICE:${PN} = "gpu-k8s-nvidia-nodes.service"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"

# modprobe (kmod); nvidia-uvm.ko itself, from meta-tegra's nvidia-kernel-oot (tegra264.inc's
# MACHINE_EXTRA_RDEPENDS brings it too, through nvidia-kernel-oot-compute). stat, mknod and awk
# come with the base system (busybox or coreutils).
RDEPENDS:${PN} = "kmod nv-kernel-module-nvidia-uvm"
