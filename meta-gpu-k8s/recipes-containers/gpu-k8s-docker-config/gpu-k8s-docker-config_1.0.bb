SUMMARY = "Docker daemon configuration for GPU Kubernetes nodes"
DESCRIPTION = "Installs /etc/docker/daemon.json: cgroupfs driver to match the k3s kubelet, \
and the NVIDIA runtime as docker's default on Jetson and, in CDI mode, on x86-64 with the NVIDIA \
stack, so GPU pods need no runtimeClassName."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - no upstream source: our own config files, MIT
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://daemon.json \
           file://daemon-nvidia-cdi.json \
"

S = "${UNPACKDIR}"

inherit gpu_k8s_nvidia

# daemon.json differs per machine (files/tegra/daemon.json on Jetson), and on x86-64 with the
# NVIDIA stack (GPU_K8S_NVIDIA) is daemon-nvidia-cdi.json: the toolkit's runtime in CDI mode
# as the default, and docker's own CDI for `docker run --device nvidia.com/gpu=all`.
PACKAGE_ARCH = "${MACHINE_ARCH}"
GPU_K8S_DOCKER_DAEMON_JSON = "${@'daemon-nvidia-cdi.json' if d.getVar('GPU_K8S_NVIDIA') == '1' else 'daemon.json'}"

do_install() {
    install -d ${D}${sysconfdir}/docker
    install -m 0644 ${UNPACKDIR}/${GPU_K8S_DOCKER_DAEMON_JSON} ${D}${sysconfdir}/docker/daemon.json
}

CONFFILES:${PN} = "${sysconfdir}/docker/daemon.json"

RDEPENDS:${PN} = "docker"
RDEPENDS:${PN}:append:tegra = " nvidia-container-runtime"
RDEPENDS:${PN}:append = " ${@'nvidia-container-toolkit' if d.getVar('GPU_K8S_NVIDIA') == '1' else ''}"
