SUMMARY = "GPU Kubernetes node: docker, k3s, NVIDIA runtime and the GPU device plugin"
DESCRIPTION = "Everything a meta-gpu-k8s node runs: docker with its daemon.json, k3s in the \
role GPU_K8S_K3S_ROLE selects (server or agent) with its config, the GPU device plugin; on \
Jetson the NVIDIA container runtime; on QEMU the preloaded smoke/pause images."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"

# Contents differ per machine (:tegra, :qemuall), so not allarch.
PACKAGE_ARCH = "${MACHINE_ARCH}"

inherit packagegroup gpu_k8s_role

GPU_K8S_K3S_PACKAGE = "${@'k3s-agent' if d.getVar('GPU_K8S_K3S_ROLE') == 'agent' else 'k3s-server'}"

RDEPENDS:${PN} = " \
    ${GPU_K8S_K3S_PACKAGE} \
    ca-certificates \
    docker \
    gpu-device-plugin \
    gpu-k8s-docker-config \
    gpu-k8s-k3s-config \
"
# nvidia-docker is left out: it only adds a CLI wrapper and its own daemon.json.
RDEPENDS:${PN}:append:tegra = " \
    libnvidia-container-tools \
    nvidia-container-runtime \
    nvidia-container-toolkit \
"
RDEPENDS:${PN}:append:qemuall = " gpu-k8s-preload-images"
