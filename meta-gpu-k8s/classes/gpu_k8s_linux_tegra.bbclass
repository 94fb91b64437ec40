# Inherited by our linux-tegra bbappend only when DISTRO_FEATURES has "gpu-k8s".
# linux-tegra has no kernel-cache (kmeta), so meta-virtualization's docker/kubernetes
# fragments never reach it: the options docker and k3s need come from this fragment.
SRC_URI += "file://gpu-k8s-containers.cfg"
