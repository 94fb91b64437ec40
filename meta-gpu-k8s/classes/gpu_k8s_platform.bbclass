# Where the Jetsons differ, in one place, as SoC overrides; recipes inherit this class and read
# the values (their own ?= knobs still win from local.conf).
#   tegra210  Jetson Nano, kirkstone + meta-tegra kirkstone-l4t-r32.7.x: L4T R32.7, linux-tegra
#             4.9 (cgroup v1 only), 4 GB shared with the GPU, container toolkit 1.0.5 with a
#             separate nvidia-container-runtime package.
#   tegra234  Jetson Orin, wrynose + meta-tegra wrynose: L4T R39.2, linux-noble-nvidia-tegra 6.8
#             (cgroup v2, systemd's only hierarchy on wrynose), container toolkit 1.19.1, whose
#             package ships nvidia-container-runtime itself; the iGPU on nvgpu.
#   tegra264  Jetson Thor, the same series, BSP, kernel and toolkit as the Orin; the Blackwell
#             iGPU runs on NVIDIA's open kernel driver (OpenRM: nvidia.ko, nvidia-uvm.ko), whose
#             NVML answers, and which makes no device nodes of its own.
# What the Orin and Thor share is set for "tegra" and undone for tegra210; everything else
# (x86-64, QEMU) takes the plain values.

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
# Our drop-in that sets isolation (and, on Orin, CSV mode) after the toolkit's setup unit
# wrote the config (dynamic-layers/tegra/recipes-containers/gpu-k8s-nvidia-runtime-config).
GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE = ""
GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE:tegra = "gpu-k8s-nvidia-runtime-config"
GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE:tegra210 = ""

# GPU_K8S_CUDA's default (packagegroup-gpu-k8s): the Nano's pods take the CUDA runtime from the
# host (one CSV per library package on L4T R32); on L4T R39 (Orin and Thor alike) drivers.csv
# lists libcuda, NVML and the JIT compiler but no libcudart and nothing of /usr/local/cuda, so
# pods bring their own CUDA runtime and the host needs only the driver.
GPU_K8S_DEFAULT_CUDA = "runtime"
GPU_K8S_DEFAULT_CUDA:tegra = "driver"
GPU_K8S_DEFAULT_CUDA:tegra210 = "runtime"

# Kubelet reservations, eviction and image GC for the 4 GB Nano ("default": k3s's defaults;
# the Orin devkits have 8 GB or more).
GPU_K8S_DEFAULT_KUBELET_PROFILE = "default"
GPU_K8S_DEFAULT_KUBELET_PROFILE:tegra210 = "small-4gb"
# kube-router's network policy needs ipset, which is unreliable on the Nano's 4.9 kernel; the
# Orin's 6.8 kernel has it (linux-noble-nvidia-tegra fragment).
GPU_K8S_DEFAULT_DISABLE_NETWORK_POLICY = "0"
GPU_K8S_DEFAULT_DISABLE_NETWORK_POLICY:tegra210 = "1"

# meta-tegra wrynose's nvidia-container-toolkit writes the runtime's config into /run at every
# boot with this unit (nvidia-ctk config generate-default: mode auto, NVIDIA_VISIBLE_DEVICES
# accepted from any container); whatever runs the runtime (docker is ordered by the unit
# itself, k3s's containerd is not) must start after it.
GPU_K8S_NVIDIA_SETUP_UNIT = ""
GPU_K8S_NVIDIA_SETUP_UNIT:tegra = "nvidia-container-setup.service"
GPU_K8S_NVIDIA_SETUP_UNIT:tegra210 = ""

# GPU isolation: "1" (default) makes the NVIDIA runtime ignore NVIDIA_VISIBLE_DEVICES from
# unprivileged containers, so a pod gets only the GPUs the device plugin allocated it (handed
# over as volume mounts); privileged containers keep the variable. "0" restores the toolkit's
# default (any container that sets the variable gets the GPUs). x86-64: the toolkit's
# config.toml; Orin and Thor: a drop-in for GPU_K8S_NVIDIA_SETUP_UNIT. The Nano's runtime (toolkit
# 1.0.5) has no such setting: it honours the variable from every container (docs/layer.md).
GPU_K8S_GPU_ISOLATION ??= "1"

# The mode the NVIDIA runtime is pinned to after the setup unit wrote its config ("" keeps
# the generated "auto"). The Orin's and Thor's GPUs go to containers in CSV mode (devices.csv,
# drivers.csv); toolkit 1.19.1's "auto" picks CSV only when, at that container's start, NVML is
# absent or initialises and names an integrated GPU ("(nvgpu)", "NVIDIA Thor"). meta-tegra
# installs NVML, so on an Orin or a Thor whose NVML fails to initialise for any reason (the
# driver not up yet, a version mismatch after a half-applied update) "auto" turns to jit-cdi,
# the discrete-GPU mode, whose devices are not the ones the device plugin hands out.
GPU_K8S_NVIDIA_RUNTIME_MODE = ""
GPU_K8S_NVIDIA_RUNTIME_MODE:tegra234 = "csv"
GPU_K8S_NVIDIA_RUNTIME_MODE:tegra264 = "csv"

# Thor: the unit that loads nvidia-uvm and creates the OpenRM driver's device nodes
# (/dev/nvidia<N>, /dev/nvidiactl, /dev/nvidia-modeset, /dev/nvidia-uvm, /dev/nvidia-uvm-tools)
# before docker, k3s and the device plugin start (dynamic-layers/tegra/recipes-containers/
# gpu-k8s-nvidia-nodes). NVIDIA's open driver registers its character devices with no device
# class, so udev sees nothing to make a node of; nvidia-modprobe, which makes them on a dGPU, is
# not in meta-tegra; meta-tegra loads nvidia.ko at boot (nv-load-display-modules) but never
# nvidia-uvm; and CSV mode gives a container only the nodes that exist when it starts. Without
# this a CUDA program in a pod finds no usable GPU. nvgpu (Orin) and the Nano's driver make
# their own nodes.
GPU_K8S_NVIDIA_NODES_PACKAGE = ""
GPU_K8S_NVIDIA_NODES_PACKAGE:tegra264 = "gpu-k8s-nvidia-nodes"

# Thor: pynvml, through which the device plugin reads the GPU's utilization
# (DCGM_FI_DEV_GPU_UTIL): Thor's open driver answers NVML (meta-tegra's tegra-libraries-nvml,
# which the toolkit already installs) and has no nvgpu load file. nvgpu (Nano, Orin) has one.
GPU_K8S_NVML_PYTHON_PACKAGE = ""
GPU_K8S_NVML_PYTHON_PACKAGE:tegra264 = "python3-nvidia-ml-py"
