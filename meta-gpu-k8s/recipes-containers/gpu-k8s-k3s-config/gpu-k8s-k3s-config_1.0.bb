SUMMARY = "k3s configuration drop-ins and unit drop-ins for GPU nodes"
DESCRIPTION = "Installs k3s configuration drop-ins in /etc/rancher/k3s/config.yaml.d/ (docker or \
k3s's containerd as the runtime, cgroup settings, kubelet reservations and eviction on small \
boards, server add-ons, preloaded pause image, site labels) and vendor drop-ins for the k3s \
units that derive a stable node name from the hardware and write the GPU node labels from \
discovery at boot; on servers, the admission policies that refuse the NVIDIA toolkit's feature \
variables from unprivileged GPU pods. Leaves /etc/rancher/k3s/config.yaml to provisioning; holds no token."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - no upstream source: our own config files, MIT
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://gpu-k8s-k3s-config.py \
           file://gpu-k8s-k3s-node-name \
           file://10-gpu-k8s-node.conf \
           file://20-gpu-k8s-docker.conf \
           file://40-gpu-k8s-admission.conf \
           file://gpu-k8s-nvidia-feature-variables.yaml \
"

S = "${UNPACKDIR}"

inherit gpu_k8s_nvidia gpu_k8s_role gpu_k8s_platform python3native

# Everything below depends on the machine.
PACKAGE_ARCH = "${MACHINE_ARCH}"

# Container runtime of the pods: "docker" (docker's default runtime, nvidia on Jetson) or
# "containerd" (k3s's own; nvidia made its default runtime on Jetson).
GPU_K8S_K3S_RUNTIME ?= "docker"

# cgroups (GPU_K8S_CGROUP_V1, GPU_K8S_CGROUP_DRIVER) per machine:
# classes/gpu_k8s_platform.bbclass. The Nano's 4.9 kernel has v1 only (cgroupfs driver,
# kubelet told to accept v1); Orin and x86-64 run the unified hierarchy with the systemd
# driver, as docker's daemon.json there.
# nvidia-container-runtime: meta-tegra's on Jetson, the toolkit's (CDI mode) on x86-64 with
# the NVIDIA stack (classes/gpu_k8s_nvidia.bbclass).
GPU_K8S_NVIDIA_RUNTIME = "${GPU_K8S_NVIDIA}"
GPU_K8S_NVIDIA_RUNTIME:tegra = "1"

# Kubelet reservations, eviction and image GC (defaults per machine in gpu_k8s_platform).
GPU_K8S_KUBELET_PROFILE ?= "${GPU_K8S_DEFAULT_KUBELET_PROFILE}"

# Site labels (space separated key=value). GPU labels come from discovery at boot.
GPU_K8S_NODE_LABELS ?= ""
# The node label update.gpu-k8s.io/device-type: which update artifacts this image installs.
# Mender's device type where A/B updates are on (it defaults to MACHINE), else MACHINE, so
# `./task rollout` never sends an artifact to a node of another type (Orin included).
GPU_K8S_UPDATE_DEVICE_TYPE ?= "${@d.getVar('MENDER_DEVICE_TYPE') or d.getVar('MACHINE')}"

# QEMU smoke runs may have no registry access: sandbox image preloaded by gpu-k8s-preload-images,
# and the packaged components that would pull images are off.
GPU_K8S_DEFAULT_PAUSE_IMAGE = ""
GPU_K8S_DEFAULT_PAUSE_IMAGE:qemuall = "localhost/gpu-k8s-pause:latest"
GPU_K8S_K3S_PAUSE_IMAGE ?= "${GPU_K8S_DEFAULT_PAUSE_IMAGE}"
# Server add-ons left out: QEMU (no registry), a Nano built as server (4 GB: no ingress,
# service load balancer or metrics API; CoreDNS and local-path storage stay).
GPU_K8S_DEFAULT_K3S_DISABLE = ""
GPU_K8S_DEFAULT_K3S_DISABLE:tegra210 = "traefik servicelb metrics-server"
GPU_K8S_DEFAULT_K3S_DISABLE:qemuall = "traefik servicelb metrics-server local-storage coredns"
GPU_K8S_K3S_DISABLE ?= "${GPU_K8S_DEFAULT_K3S_DISABLE}"
# kube-router's network policy: off on a Nano server (gpu_k8s_platform says why).
GPU_K8S_K3S_DISABLE_NETWORK_POLICY ?= "${GPU_K8S_DEFAULT_DISABLE_NETWORK_POLICY}"

# k3s's airgap images tarball (no registry needed for k3s's own images): on for QEMU, off for
# the Nano's SD card and genericx86-64 (they pull from registries). Rootfs growth: docs/layer.md.
GPU_K8S_DEFAULT_K3S_AIRGAP_IMAGES = "0"
GPU_K8S_DEFAULT_K3S_AIRGAP_IMAGES:qemuall = "1"
# nooelint: oelint.vars.mispell.unknown - our own knob, documented in docs/layer.md
GPU_K8S_K3S_AIRGAP_IMAGES ?= "${GPU_K8S_DEFAULT_K3S_AIRGAP_IMAGES}"

K3S_CONFIG_DIR = "${sysconfdir}/rancher/k3s/config.yaml.d"

# The renderer's arguments, one variable: do_install runs it with them, and `./task
# check-image` renders the same drop-ins at parse time to find k3s's data-dir and the
# kubelet's root-dir (tools/image/bitbake_probe.py).
GPU_K8S_K3S_CONFIG_ARGS = "--role '${GPU_K8S_K3S_ROLE}' \
    --runtime '${GPU_K8S_K3S_RUNTIME}' \
    --cgroup-driver '${GPU_K8S_CGROUP_DRIVER}' \
    --cgroup-v1 '${GPU_K8S_CGROUP_V1}' \
    --nvidia-runtime '${GPU_K8S_NVIDIA_RUNTIME}' \
    --kubelet-profile '${GPU_K8S_KUBELET_PROFILE}' \
    --disable '${GPU_K8S_K3S_DISABLE}' \
    --disable-network-policy '${GPU_K8S_K3S_DISABLE_NETWORK_POLICY}' \
    --pause-image '${GPU_K8S_K3S_PAUSE_IMAGE}' \
    --node-labels '${GPU_K8S_NODE_LABELS}' \
    --device-type '${GPU_K8S_UPDATE_DEVICE_TYPE}' \
"

do_install() {
    ${PYTHON} ${UNPACKDIR}/gpu-k8s-k3s-config.py --output-dir ${D}${K3S_CONFIG_DIR} ${GPU_K8S_K3S_CONFIG_ARGS}

    install -d ${D}${libexecdir}/gpu-k8s
    install -m 0755 ${UNPACKDIR}/gpu-k8s-k3s-node-name ${D}${libexecdir}/gpu-k8s/

    # Vendor drop-ins belong beside the units, not in /etc/systemd/system (the admin's).
    for unit in k3s k3s-agent; do
        dir=${D}${systemd_system_unitdir}/$unit.service.d
        install -d $dir
        install -m 0644 ${UNPACKDIR}/10-gpu-k8s-node.conf $dir/
        sed -i -e 's#@LIBEXECDIR@#${libexecdir}#g' -e 's#@BINDIR@#${bindir}#g' \
            -e 's#@SYSCONFDIR@#${sysconfdir}#g' $dir/10-gpu-k8s-node.conf
        if [ "${GPU_K8S_K3S_RUNTIME}" = "docker" ]; then
            install -m 0644 ${UNPACKDIR}/20-gpu-k8s-docker.conf $dir/
        fi
        # Orin and Thor: k3s requires the NVIDIA runtime's settings to be in force
        # (gpu-k8s-nvidia-runtime-config's drop-in orders it after their check)
    done

    # The server applies the admission policies (every machine: a Nano or QEMU server as well
    # as the GPU nodes it serves); GPU_K8S_GPU_ISOLATION = "0" leaves them out.
    if [ "${GPU_K8S_GPU_ISOLATION}" = "1" ]; then
        install -d ${D}${datadir}/gpu-k8s/admission
        install -m 0644 ${UNPACKDIR}/gpu-k8s-nvidia-feature-variables.yaml ${D}${datadir}/gpu-k8s/admission/
        install -m 0644 ${UNPACKDIR}/40-gpu-k8s-admission.conf ${D}${systemd_system_unitdir}/k3s.service.d/
        sed -i -e 's#@DATADIR@#${datadir}#g' ${D}${systemd_system_unitdir}/k3s.service.d/40-gpu-k8s-admission.conf
    fi
}

FILES:${PN} += "${systemd_system_unitdir}/k3s.service.d ${systemd_system_unitdir}/k3s-agent.service.d \
                ${datadir}/gpu-k8s/admission"

# The airgap images recipe exists only with the gpu-k8s distro feature (like our k3s).
GPU_K8S_AIRGAP_PACKAGE = "${@'k3s-airgap-images' if d.getVar('GPU_K8S_K3S_AIRGAP_IMAGES') == '1' and bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', True, False, d) else ''}"
GPU_K8S_DOCKER_PACKAGE = "${@'docker' if d.getVar('GPU_K8S_K3S_RUNTIME') == 'docker' else ''}"
RDEPENDS:${PN} = "${GPU_K8S_AIRGAP_PACKAGE} ${GPU_K8S_DOCKER_PACKAGE}"

# nooelint: oelint.task.noanonpython - a wrong knob must stop the parse, not build a wrong image
python () {
    for var, allowed in (('GPU_K8S_K3S_RUNTIME', ('docker', 'containerd')),
                         ('GPU_K8S_K3S_AIRGAP_IMAGES', ('0', '1')),
                         ('GPU_K8S_GPU_ISOLATION', ('0', '1'))):
        value = d.getVar(var)
        if value not in allowed:
            bb.fatal('%s must be one of %s, got "%s" (set it in local.conf)' % (var, ', '.join(allowed), value))
}
