# Inherited by our linux-yocto bbappend only when DISTRO_FEATURES has "gpu-k8s": what
# `k3s check-config` requires for the pinned k3s release, plus ipset/xt_set, as modules
# where linux-yocto builds them (the k3s recipe RRECOMMENDS the module packages).
# The series may add a fragment for its kernel version (conf/series/<series>.inc).
SRC_URI += "file://gpu-k8s-k3s.cfg ${GPU_K8S_LINUX_YOCTO_SERIES_CFG}"
