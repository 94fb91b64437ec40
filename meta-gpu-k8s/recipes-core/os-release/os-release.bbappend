# Names the k3s release in /etc/os-release (GPU_K8S_K3S_VERSION=...), only when DISTRO_FEATURES
# has "gpu-k8s" (classes/gpu_k8s_os_release.bbclass).
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', 'gpu_k8s_os_release', '', d)}
