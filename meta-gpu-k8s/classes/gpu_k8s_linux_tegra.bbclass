# Inherited by our linux-tegra bbappend only when DISTRO_FEATURES has "gpu-k8s".
# linux-tegra has no kernel-cache (kmeta), so meta-virtualization's docker/kubernetes
# fragments never reach it: the options docker and k3s need come from this fragment.
FILESEXTRAPATHS:prepend := "${GPU_K8S_LAYERDIR}/dynamic-layers/tegra/recipes-kernel/linux/linux-tegra:"

SRC_URI += "file://gpu-k8s-containers.cfg"
