# Changes linux-yocto only when DISTRO_FEATURES has "gpu-k8s" (classes/gpu_k8s_linux_yocto.bbclass).
# The fragment lives beside this file (FILESEXTRAPATHS is not part of any task signature).
FILESEXTRAPATHS:prepend := "${THISDIR}/linux-yocto:"
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', 'gpu_k8s_linux_yocto', '', d)}
