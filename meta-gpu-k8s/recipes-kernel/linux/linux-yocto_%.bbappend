# Changes linux-yocto only when DISTRO_FEATURES has "gpu-k8s" (classes/gpu_k8s_linux_yocto.bbclass).
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', 'gpu_k8s_linux_yocto', '', d)}
