# linux-tegra has no kernel-cache (kmeta), so meta-virtualization's docker/kubernetes
# features never reach it: the options docker and k3s need come from this fragment.
FILESEXTRAPATHS:prepend := "${THISDIR}/linux-tegra:"

SRC_URI += "file://gpu-k8s-containers.cfg"
