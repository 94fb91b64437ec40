# Changes linux-tegra only when DISTRO_FEATURES has "gpu-k8s" (classes/gpu_k8s_linux_tegra.bbclass).
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', 'gpu_k8s_linux_tegra', '', d)}
