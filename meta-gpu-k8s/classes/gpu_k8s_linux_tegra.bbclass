# Inherited by our Jetson kernel bbappends only when DISTRO_FEATURES has "gpu-k8s": the Nano's
# linux-tegra (4.9) and the Orin's linux-noble-nvidia-tegra (6.8). Neither has a kernel-cache
# (kmeta), and meta-virtualization's docker/kubernetes fragments only reach linux-yocto: the
# options docker and k3s need come from this fragment, one per kernel beside its bbappend.
SRC_URI += "file://gpu-k8s-containers.cfg"
