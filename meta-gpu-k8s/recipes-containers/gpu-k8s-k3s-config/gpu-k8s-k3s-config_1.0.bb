SUMMARY = "k3s configuration for GPU nodes: docker runtime, GPU node labels"
DESCRIPTION = "Writes /etc/rancher/k3s/config.yaml (docker as container runtime, node labels \
that name the GPU, optional local pause image and disabled packaged components) and \
systemd drop-ins that start k3s after docker. Holds no token or other secret."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - no upstream source: our own config files, MIT
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://config.yaml \
           file://20-gpu-k8s.conf \
           file://20-gpu-k8s-agent.conf \
"

S = "${WORKDIR}"

inherit gpu_k8s_role

# Labels, pause image and disabled components depend on the machine.
PACKAGE_ARCH = "${MACHINE_ARCH}"

# Set GPU_K8S_NODE_LABELS in local.conf to replace the machine's default labels.
GPU_K8S_DEFAULT_NODE_LABELS = "nvidia.com/gpu.present=true nvidia.com/gpu.discovery=auto"
GPU_K8S_DEFAULT_NODE_LABELS:tegra = "nvidia.com/gpu.present=true nvidia.com/gpu.discovery=tegra"
GPU_K8S_DEFAULT_NODE_LABELS:tegra210 = "nvidia.com/gpu.present=true nvidia.com/gpu.discovery=tegra \
    nvidia.com/gpu.family=maxwell nvidia.com/gpu.product=NVIDIA-Tegra-X1 \
    nvidia.com/gpu.compute.major=5 nvidia.com/gpu.compute.minor=3"
GPU_K8S_DEFAULT_NODE_LABELS:qemuall = "nvidia.com/gpu.present=true nvidia.com/gpu.discovery=simulated \
    nvidia.com/gpu.product=simulated"
GPU_K8S_NODE_LABELS ?= "${GPU_K8S_DEFAULT_NODE_LABELS}"

# QEMU smoke runs may have no registry access: sandbox image preloaded by gpu-k8s-preload-images,
# and the packaged components that would pull images are off.
GPU_K8S_DEFAULT_PAUSE_IMAGE = ""
GPU_K8S_DEFAULT_PAUSE_IMAGE:qemuall = "localhost/gpu-k8s-pause:latest"
GPU_K8S_K3S_PAUSE_IMAGE ?= "${GPU_K8S_DEFAULT_PAUSE_IMAGE}"
GPU_K8S_DEFAULT_K3S_DISABLE = ""
GPU_K8S_DEFAULT_K3S_DISABLE:qemuall = "traefik servicelb metrics-server local-storage coredns"
GPU_K8S_K3S_DISABLE ?= "${GPU_K8S_DEFAULT_K3S_DISABLE}"

do_install() {
    install -d ${D}${sysconfdir}/rancher/k3s
    install -m 0644 ${WORKDIR}/config.yaml ${D}${sysconfdir}/rancher/k3s/config.yaml
    conf=${D}${sysconfdir}/rancher/k3s/config.yaml
    printf 'node-label:\n' >> $conf
    for label in ${GPU_K8S_NODE_LABELS}; do
        printf '  - "%s"\n' "$label" >> $conf
    done
    if [ -n "${GPU_K8S_K3S_PAUSE_IMAGE}" ]; then
        printf 'pause-image: "%s"\n' "${GPU_K8S_K3S_PAUSE_IMAGE}" >> $conf
    fi
    # "disable" is a server-only flag: keep it out of an agent's config.yaml.
    if [ "${GPU_K8S_K3S_ROLE}" = "server" ] && [ -n "${GPU_K8S_K3S_DISABLE}" ]; then
        printf 'disable:\n' >> $conf
        for component in ${GPU_K8S_K3S_DISABLE}; do
            printf '  - "%s"\n' "$component" >> $conf
        done
    fi

    install -d ${D}${sysconfdir}/systemd/system/k3s.service.d ${D}${sysconfdir}/systemd/system/k3s-agent.service.d
    install -m 0644 ${WORKDIR}/20-gpu-k8s.conf ${D}${sysconfdir}/systemd/system/k3s.service.d/
    install -m 0644 ${WORKDIR}/20-gpu-k8s.conf ${D}${sysconfdir}/systemd/system/k3s-agent.service.d/
    install -m 0644 ${WORKDIR}/20-gpu-k8s-agent.conf ${D}${sysconfdir}/systemd/system/k3s-agent.service.d/
}

CONFFILES:${PN} = "${sysconfdir}/rancher/k3s/config.yaml"
