# Where the Jetson Nano and the Jetson Orin differ, in one place, as SoC overrides; recipes
# inherit this class and read the values (their own ?= knobs still win from local.conf).
#   tegra210  Jetson Nano, kirkstone + meta-tegra kirkstone-l4t-r32.7.x: L4T R32.7, linux-tegra
#             4.9 (cgroup v1 only), 4 GB shared with the GPU, container toolkit 1.0.5 with a
#             separate nvidia-container-runtime package.
#   tegra234  Jetson Orin, wrynose + meta-tegra wrynose: L4T R39.2, linux-noble-nvidia-tegra 6.8
#             (cgroup v2, systemd's only hierarchy on wrynose), container toolkit 1.19.1, whose
#             package ships nvidia-container-runtime itself.
# Everything else (x86-64, QEMU) takes the plain values.

# cgroup hierarchy and the cgroup driver docker and the kubelet share.
GPU_K8S_CGROUP_V1 = "0"
GPU_K8S_CGROUP_V1:tegra210 = "1"
GPU_K8S_CGROUP_DRIVER = "systemd"
GPU_K8S_CGROUP_DRIVER:tegra210 = "cgroupfs"

# The package holding /usr/bin/nvidia-container-runtime, docker's default runtime.
GPU_K8S_NVIDIA_RUNTIME_PACKAGE = ""
GPU_K8S_NVIDIA_RUNTIME_PACKAGE:tegra = "nvidia-container-toolkit"
GPU_K8S_NVIDIA_RUNTIME_PACKAGE:tegra210 = "nvidia-container-runtime"
# The container stack an image needs: the prestart hook (nvidia-container-toolkit; on Orin it
# is also the runtime and generates its CSV-mode config at boot), nvidia-container-cli, and on
# the Nano the separate runtime package.
GPU_K8S_NVIDIA_CONTAINER_PACKAGES = ""
GPU_K8S_NVIDIA_CONTAINER_PACKAGES:tegra = "libnvidia-container-tools nvidia-container-toolkit"
GPU_K8S_NVIDIA_CONTAINER_PACKAGES:tegra210 = "libnvidia-container-tools nvidia-container-toolkit nvidia-container-runtime"

# Kubelet reservations, eviction and image GC for the 4 GB Nano ("default": k3s's defaults;
# the Orin devkits have 8 GB or more).
GPU_K8S_DEFAULT_KUBELET_PROFILE = "default"
GPU_K8S_DEFAULT_KUBELET_PROFILE:tegra210 = "small-4gb"
# kube-router's network policy needs ipset, which is unreliable on the Nano's 4.9 kernel; the
# Orin's 6.8 kernel has it (linux-noble-nvidia-tegra fragment).
GPU_K8S_DEFAULT_DISABLE_NETWORK_POLICY = "0"
GPU_K8S_DEFAULT_DISABLE_NETWORK_POLICY:tegra210 = "1"

# meta-tegra wrynose's nvidia-container-toolkit writes the runtime's config (CSV mode with
# its alternate roots) into /run at every boot with this unit; whatever runs the runtime
# (docker is ordered by the unit itself, k3s's containerd is not) must start after it.
GPU_K8S_NVIDIA_SETUP_UNIT = ""
GPU_K8S_NVIDIA_SETUP_UNIT:tegra = "nvidia-container-setup.service"
GPU_K8S_NVIDIA_SETUP_UNIT:tegra210 = ""
