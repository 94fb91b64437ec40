# Changes grub-mender-grubenv only with the A/B class (classes/gpu_k8s_mender_grubenv.bbclass).
# The snippet lives beside this file (FILESEXTRAPATHS is not part of any task signature).
FILESEXTRAPATHS:prepend := "${THISDIR}/files:"
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s-mender', 'gpu_k8s_mender_grubenv', '', d)}
