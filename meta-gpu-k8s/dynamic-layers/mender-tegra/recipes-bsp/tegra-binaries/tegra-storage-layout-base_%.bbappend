# Changes tegra-storage-layout-base only with the A/B class: the machine's flash layouts get
# the data partition (classes/gpu_k8s_mender_tegra_layout.bbclass, lib/gpu_k8s/tegra_layout.py).
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s-mender', 'gpu_k8s_mender_tegra_layout', '', d)}
