SUMMARY = "Docker daemon configuration for GPU Kubernetes nodes"
DESCRIPTION = "Installs /etc/docker/daemon.json: cgroupfs driver to match the k3s kubelet, \
and on Jetson the NVIDIA runtime as docker's default so GPU pods need no runtimeClassName."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - no upstream source: our own config files, MIT
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://daemon.json"

S = "${UNPACKDIR}"

# daemon.json differs per machine (files/tegra/daemon.json on Jetson).
PACKAGE_ARCH = "${MACHINE_ARCH}"

do_install() {
    install -d ${D}${sysconfdir}/docker
    install -m 0644 ${UNPACKDIR}/daemon.json ${D}${sysconfdir}/docker/daemon.json
}

CONFFILES:${PN} = "${sysconfdir}/docker/daemon.json"

RDEPENDS:${PN} = "docker"
RDEPENDS:${PN}:append:tegra = " nvidia-container-runtime"
