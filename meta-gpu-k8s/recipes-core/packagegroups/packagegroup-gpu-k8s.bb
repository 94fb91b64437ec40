SUMMARY = "GPU Kubernetes node: docker, k3s, NVIDIA runtime and the GPU device plugin"
DESCRIPTION = "Everything a meta-gpu-k8s node runs: docker with its daemon.json, k3s in the \
role GPU_K8S_K3S_ROLE selects (server or agent) with its config, the GPU device plugin, the \
netfilter modules k3s loads; on Jetson the NVIDIA container runtime and the CUDA userspace \
GPU_K8S_CUDA selects; on x86-64 the NVIDIA driver, container toolkit and CDI spec unit \
(GPU_K8S_NVIDIA); on QEMU the preloaded smoke/pause images."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"

# Contents differ per machine (:tegra, :qemuall), so not allarch.
PACKAGE_ARCH = "${MACHINE_ARCH}"

inherit packagegroup gpu_k8s_role gpu_k8s_nvidia gpu_k8s_platform gpu_k8s_repo_source
# skipped with the plugin and the update agent it installs where plugin/ or updater/ is missing
GPU_K8S_REPO_SOURCE = "plugin updater"

GPU_K8S_K3S_PACKAGE = "${@'k3s-agent' if d.getVar('GPU_K8S_K3S_ROLE') == 'agent' else 'k3s-server'}"

RDEPENDS:${PN} = " \
    ${GPU_K8S_K3S_PACKAGE} \
    ca-certificates \
    docker \
    gpu-device-plugin \
    gpu-k8s-docker-config \
    gpu-k8s-k3s-config \
"

# The NVIDIA container stack differs per SoC (GPU_K8S_NVIDIA_CONTAINER_PACKAGES, classes/
# gpu_k8s_platform.bbclass). nvidia-docker is left out: a CLI wrapper with its own daemon.json.
# The GPU driver itself comes with the machine (packagegroup-machine-base in the image); on Thor
# the unit that makes its device nodes (GPU_K8S_NVIDIA_NODES_PACKAGE) and pynvml for its GPU
# utilization (GPU_K8S_NVML_PYTHON_PACKAGE) come from here.
RDEPENDS:${PN}:append:tegra = " \
    ${GPU_K8S_NVIDIA_CONTAINER_PACKAGES} \
    ${GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE} \
    ${GPU_K8S_NVIDIA_NODES_PACKAGE} \
    ${GPU_K8S_NVML_PYTHON_PACKAGE} \
    ${GPU_K8S_CUDA_PACKAGES} \
"
RDEPENDS:${PN}:append:qemuall = " gpu-k8s-preload-images"

# x86-64 discrete GPUs (classes/gpu_k8s_nvidia.bbclass): nvidia.ko and the same-version CUDA
# driver and NVML, the persistence daemon, the toolkit whose runtime adds them to containers,
# the unit that writes the CDI spec at boot, and pynvml for the plugin's NVML discovery; Fabric
# Manager for NVSwitch systems where its archive is pinned (GPU_K8S_NVIDIA_FABRICMANAGER).
GPU_K8S_NVIDIA_PACKAGES = " \
    gpu-k8s-nvidia-cdi \
    nvidia-container-toolkit \
    nvidia-driver-libcuda \
    nvidia-driver-libnvidia-ml \
    nvidia-driver-persistenced \
    nvidia-driver-tools \
    nvidia-open-gpu-kernel-modules \
    python3-nvidia-ml-py \
"
GPU_K8S_NVIDIA_FABRICMANAGER_PACKAGE = "${@'nvidia-fabricmanager' if d.getVar('GPU_K8S_NVIDIA_FABRICMANAGER') == '1' else ''}"
RDEPENDS:${PN}:append = " ${@d.getVar('GPU_K8S_NVIDIA_PACKAGES') + ' ' + d.getVar('GPU_K8S_NVIDIA_FABRICMANAGER_PACKAGE') if d.getVar('GPU_K8S_NVIDIA') == '1' else ''}"
# The driver version and Fabric Manager's pins (GPU_K8S_NVIDIA_FABRICMANAGER's default reads them).
require recipes-graphics/nvidia-driver/nvidia-driver-version.inc

# A/B updates (classes/gpu_k8s_mender.bbclass): node state on the data partition, the
# update agent (health gate, upgrade command), the hardware watchdog, the images rollout
# jobs run; on servers the controller's manifest.
RDEPENDS:${PN}:append:gpu-k8s-mender = " \
    gpu-k8s-data \
    gpu-k8s-system-upgrade-images \
    gpu-k8s-update \
    gpu-k8s-watchdog \
    ${@'gpu-k8s-system-upgrade' if d.getVar('GPU_K8S_K3S_ROLE') == 'server' else ''} \
"

# Kernel modules k3s modprobes at start (br_netfilter: bridged pod traffic through
# iptables, without it pod -> ClusterIP on the same node, DNS included, breaks; ip_set and
# xt_set: the network policy controller). The layer's k3s recommends them too; named here
# as well because meta-virtualization's k3s (used without DISTRO_FEATURES gpu-k8s) does not.
# Recommends, not depends: a kernel that builds one in (linux-tegra's fragment does) has no
# package for it, and modprobe of a built-in module succeeds.
GPU_K8S_KERNEL_MODULES ?= " \
    kernel-module-br-netfilter \
    kernel-module-ip-set \
    kernel-module-ip-set-hash-ip \
    kernel-module-ip-set-hash-net \
    kernel-module-xt-set \
"
RRECOMMENDS:${PN} = "${GPU_K8S_KERNEL_MODULES}"

# How much of the Jetson CUDA userspace goes in (docs/layer.md). The container runtime mounts
# into a container only host files its CSV files list. L4T R32 (Nano) has one CSV per library
# package (<package>-container-csv): the host's CUDA libraries are the pods' CUDA. L4T R39
# (Orin, Thor) has one drivers.csv (tegra-configs-container-csv) that lists libcuda but no libcudart
# or anything under /usr/local/cuda: pods get the driver from the host and must bring the CUDA
# runtime and libraries themselves (JetPack 7 containers do), so there the default is "driver"
# and the higher levels serve programs on the host only. The same names on both series; each
# level includes the ones before it:
#   level      Nano, L4T R32.7 (CUDA 10.2)          Orin and Thor, L4T R39.2 (CUDA 13.2; host only)
#   driver     tegra-libraries-cuda: libcuda.so.1    the same, for nvgpu (Orin) or OpenRM (Thor)
#   runtime    + cuda-cudart 10.2                    + cuda-cudart 13.2
#   libraries  + cuBLAS, cuFFT, cuRAND, cuSOLVER,    + the same, cuFile, nvJitLink, nvFatbin,
#                cuSPARSE, NPP, NVRTC, nvGRAPH          nvJPEG (no nvGRAPH)
#   cudnn      + cuDNN 8                             + cuDNN 9.20
#   tensorrt   + TensorRT 8                          + TensorRT 10.16 (both: nvinfer, parsers,
#                                                       plugins; need DISTRO_FEATURES opengl)
# Default per SoC: GPU_K8S_DEFAULT_CUDA (classes/gpu_k8s_platform.bbclass).
GPU_K8S_CUDA ??= "${GPU_K8S_DEFAULT_CUDA}"

def gpu_k8s_cuda_levels():
    # (level, packages it adds), in order: a level brings its own and all earlier ones
    return (
        ('driver', 'tegra-libraries-cuda'),
        ('runtime', 'cuda-cudart'),
        ('libraries', 'cuda-libraries'),
        ('cudnn', 'cudnn'),
        ('tensorrt', 'tensorrt-core tensorrt-plugins'),
    )

def gpu_k8s_cuda_packages(d):
    chosen = d.getVar('GPU_K8S_CUDA')
    names = [name for name, _ in gpu_k8s_cuda_levels()]
    if chosen not in names:
        return ''
    return ' '.join(packages for _, packages in gpu_k8s_cuda_levels()[:names.index(chosen) + 1])

GPU_K8S_CUDA_PACKAGES = "${@gpu_k8s_cuda_packages(d)}"

# nooelint: oelint.task.noanonpython - a wrong level or an NVIDIA stack that cannot be built must stop the parse
python () {
    chosen = d.getVar('GPU_K8S_CUDA')
    levels = [name for name, _ in gpu_k8s_cuda_levels()]
    if chosen not in levels:
        bb.fatal('GPU_K8S_CUDA must be one of %s, got "%s" (set it in local.conf)' % (', '.join(levels), chosen))
    # Here, not in nvidia-driver: a recipe skipped for its LICENSE_FLAGS only surfaces later,
    # as a chain of "Nothing RPROVIDES" errors that do not name the fix.
    problem = gpu_k8s_nvidia_problem(d)
    if problem:
        bb.fatal(problem)
}
