# Changes linux-yocto only with the A/B class (classes/gpu_k8s_mender_watchdog.bbclass).
# The fragment lives beside this file (FILESEXTRAPATHS is not part of any task signature).
FILESEXTRAPATHS:prepend := "${THISDIR}/files:"
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s-mender', 'gpu_k8s_mender_watchdog', '', d)}
