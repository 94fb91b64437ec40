# Jetson Orin and Thor (meta-tegra wrynose): changes linux-noble-nvidia-tegra only when DISTRO_FEATURES
# has "gpu-k8s" (classes/gpu_k8s_linux_tegra.bbclass adds the fragment beside this file; the
# recipe is kernel-yocto based, so a .cfg in SRC_URI is merged into its defconfig). Its
# directory joins FILESEXTRAPATHS only with the feature too: kernel-yocto checksums every
# fragment found on FILESPATH (do_kernel_metadata). The Nano's kernel is linux-tegra_%.bbappend;
# conf/series/<series>.inc masks the one the series' meta-tegra has no recipe for.
FILESEXTRAPATHS:prepend := "${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', '${THISDIR}/linux-noble-nvidia-tegra:', '', d)}"
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', 'gpu_k8s_linux_tegra', '', d)}
