# Changes the native update module's package only with the A/B class: no unit marks a new slot
# good before the update agent's health gate runs `mender-update commit`
# (classes/gpu_k8s_mender_tegra_verify.bbclass; the drop-ins live beside this file).
FILESEXTRAPATHS:prepend := "${THISDIR}/files:"
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s-mender', 'gpu_k8s_mender_tegra_verify', '', d)}
