SUMMARY = "Docker daemon configuration for GPU Kubernetes nodes"
DESCRIPTION = "Installs /etc/docker/daemon.json: the cgroup driver the k3s kubelet uses too, \
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

inherit gpu_k8s_nvidia gpu_k8s_platform

# daemon.json differs per machine: files/tegra/ (Nano: cgroupfs on cgroup v1), files/tegra234/
# (Orin) and files/tegra264/ (Thor: both the systemd driver on cgroup v2, nvidia the default
# runtime) hold the Jetson ones, whose driver must be GPU_K8S_CGROUP_DRIVER's (classes/
# gpu_k8s_platform.bbclass; a test keeps them equal); on
# x86-64 with the NVIDIA stack (GPU_K8S_NVIDIA) it is daemon-nvidia-cdi.json: the toolkit's
# runtime in CDI mode as the default, and docker's own CDI for `docker run --device nvidia.com/gpu=all`.
# Every daemon.json but the Nano's (docker 20.10, which has one image store) pins docker's
# classic image store (features.containerd-snapshotter false): docker 29, wrynose's, puts a
# fresh install's images in containerd's store, which keeps each layer twice (packed and
# unpacked) on the data partition; the pin keeps images, containers and volumes in one tree,
# /var/lib/docker, on the docker 25 of scarthgap and the 29 of wrynose alike. Both trees are on
# /data either way (gpu-k8s-data's persist.list); `./task check-image` reads this file.
PACKAGE_ARCH = "${MACHINE_ARCH}"
GPU_K8S_DOCKER_DAEMON_JSON = "${@'daemon-nvidia-cdi.json' if d.getVar('GPU_K8S_NVIDIA') == '1' else 'daemon.json'}"

do_install() {
    install -d ${D}${sysconfdir}/docker
    install -m 0644 ${UNPACKDIR}/${GPU_K8S_DOCKER_DAEMON_JSON} ${D}${sysconfdir}/docker/daemon.json
}

CONFFILES:${PN} = "${sysconfdir}/docker/daemon.json"

RDEPENDS:${PN} = "docker"
RDEPENDS:${PN}:append:tegra = " ${GPU_K8S_NVIDIA_RUNTIME_PACKAGE}"
RDEPENDS:${PN}:append = " ${@'nvidia-container-toolkit' if d.getVar('GPU_K8S_NVIDIA') == '1' else ''}"
