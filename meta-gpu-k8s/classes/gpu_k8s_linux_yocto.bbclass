# Inherited by our linux-yocto bbappend only when DISTRO_FEATURES has "gpu-k8s": what
# `k3s check-config` requires for the pinned k3s release, plus ipset/xt_set, as modules
# where linux-yocto builds them (the k3s recipe RRECOMMENDS the module packages).
SRC_URI += "file://gpu-k8s-k3s.cfg"
