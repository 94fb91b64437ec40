# Inherited by our os-release bbappend only when DISTRO_FEATURES has "gpu-k8s":
# /etc/os-release names the k3s release the image carries, e.g. GPU_K8S_K3S_VERSION="v1.36.4+k3s1".
require recipes-containers/k3s/k3s-version.inc

GPU_K8S_K3S_VERSION = "${K3S_RELEASE}"
OS_RELEASE_FIELDS:append = " GPU_K8S_K3S_VERSION"
