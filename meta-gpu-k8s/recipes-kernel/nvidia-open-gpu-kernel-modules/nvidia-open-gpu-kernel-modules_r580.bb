SUMMARY = "NVIDIA open GPU kernel modules (R580), Turing and newer discrete GPUs"
DESCRIPTION = "nvidia.ko, nvidia-uvm.ko, nvidia-modeset.ko and nvidia-drm.ko built from \
NVIDIA's open-gpu-kernel-modules against the image's kernel. They drive Turing and newer GPUs \
(T4, A2, L4, RTX 20xx and later) through the GSP firmware that the nvidia-driver recipe \
installs, of the same version. Nouveau is kept off the GPU."
HOMEPAGE = "https://github.com/NVIDIA/open-gpu-kernel-modules"
LICENSE = "MIT | GPL-2.0-only"
LIC_FILES_CHKSUM = "file://COPYING;md5=1d5fa2a493e937d5a4b96e5e03b90f7c"

require recipes-graphics/nvidia-driver/nvidia-driver-version.inc

PV = "${NVIDIA_DRIVER_VERSION}"

# Pinned by the tag's commit (git fetch; no release tarball with a published checksum exists).
SRC_URI = "git://github.com/NVIDIA/open-gpu-kernel-modules.git;protocol=https;branch=580 \
           file://gpu-k8s-nvidia.conf \
"
SRCREV = "${NVIDIA_OPEN_GPU_KERNEL_MODULES_SRCREV}"

inherit module

# The userspace it serves is x86-64 only (nvidia-driver).
COMPATIBLE_HOST = "x86_64.*-linux"

# NVIDIA's makefiles accept ARCH=x86_64 only (module-base exports the kernel's "x86") and find
# the kernel through SYSSRC/SYSOUT. The OS-agnostic core (src/nvidia) is built by NVIDIA's own
# make, which only adds -fcf-protection when a compiler probe passes; forced here so nvidia.ko
# has IBT landing pads and loads on kernels with CONFIG_X86_KERNEL_IBT.
EXTRA_OEMAKE += "ARCH=x86_64 \
    TARGET_ARCH=x86_64 \
    SYSSRC=${STAGING_KERNEL_DIR} \
    SYSOUT=${STAGING_KERNEL_BUILDDIR} \
    EXTRA_CFLAGS=-fcf-protection=branch \
"
MODULES_MODULE_SYMVERS_LOCATION = "kernel-open"
# The core is linked without the kernel's stack protector symbols (modpost: __stack_chk_guard).
SECURITY_STACK_PROTECTOR = ""

# Loaded at boot: on a box without an NVIDIA GPU nvidia.ko logs "NVRM: No NVIDIA GPU found"
# and returns ENODEV, which systemd-modules-load reports as a notice, not a failure; a GPU
# older than Turing gets the same (the open modules refuse it, naming the GPU). nvidia-uvm is
# what CUDA needs besides nvidia; nvidia-drm and nvidia-modeset (display) stay unloaded.
KERNEL_MODULE_AUTOLOAD += "nvidia nvidia-uvm"

do_install:append() {
    install -d ${D}${sysconfdir}/modprobe.d
    install -m 0644 ${UNPACKDIR}/gpu-k8s-nvidia.conf ${D}${sysconfdir}/modprobe.d/
}

# The module class leaves ${PN} an empty meta package that depends on every module package;
# the nouveau blacklist goes with it.
FILES:${PN} += "${sysconfdir}/modprobe.d/gpu-k8s-nvidia.conf"
CONFFILES:${PN} = "${sysconfdir}/modprobe.d/gpu-k8s-nvidia.conf"
