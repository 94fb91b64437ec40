# Changes l4t-launcher-extlinux only with the A/B class (classes/gpu_k8s_mender_tegra_extlinux.bbclass).
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s-mender', 'gpu_k8s_mender_tegra_extlinux', '', d)}
