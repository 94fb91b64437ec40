# Inherited by our os-release bbappend only when DISTRO_FEATURES has "gpu-k8s":
# /etc/os-release names the k3s release the image carries, e.g. GPU_K8S_K3S_VERSION="v1.36.4+k3s1".
require recipes-containers/k3s/k3s_version.inc

# nooelint: oelint.vars.mispell.unknown - a field of our own in /etc/os-release
GPU_K8S_K3S_VERSION = "${K3S_RELEASE}"
# nooelint: oelint.vars.mispell.unknown - os-release.bb's list of fields (oe-core)
OS_RELEASE_FIELDS:append = " GPU_K8S_K3S_VERSION"
