# Changes linux-tegra only when DISTRO_FEATURES has "gpu-k8s" (classes/gpu_k8s_linux_tegra.bbclass).
# The fragment lives beside this file. Its directory joins FILESEXTRAPATHS only with the
# feature too: kernel-yocto checksums every fragment found on FILESPATH (do_kernel_metadata).
FILESEXTRAPATHS:prepend := "${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', '${THISDIR}/linux-tegra:', '', d)}"
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', 'gpu_k8s_linux_tegra', '', d)}
