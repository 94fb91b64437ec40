SUMMARY = "Imports the smoke-test and pause container images into docker at boot"
DESCRIPTION = "Ships the gpu-k8s-smoke-container rootfs and a oneshot unit that runs before \
k3s and imports it into docker as localhost/gpu-k8s-smoke:latest (smoke-test pods) and \
localhost/gpu-k8s-pause:latest (k3s sandbox image), so k3s pulls nothing from a registry."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - no upstream source: our own config files, MIT
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://gpu-k8s-preload-images.sh \
           file://gpu-k8s-preload-images.service \
"

S = "${UNPACKDIR}"

inherit systemd

# The rootfs tarball is built for this machine.
PACKAGE_ARCH = "${MACHINE_ARCH}"

GPU_K8S_CONTAINER_IMAGE ?= "gpu-k8s-smoke-container"

do_install[depends] += "${GPU_K8S_CONTAINER_IMAGE}:do_image_complete"
do_install() {
    install -d ${D}${datadir}/gpu-k8s/images
    install -m 0644 ${DEPLOY_DIR_IMAGE}/${GPU_K8S_CONTAINER_IMAGE}-${MACHINE}.tar.bz2 \
        ${D}${datadir}/gpu-k8s/images/gpu-k8s-smoke.tar.bz2
    install -d ${D}${libexecdir}
    install -m 0755 ${UNPACKDIR}/gpu-k8s-preload-images.sh ${D}${libexecdir}/gpu-k8s-preload-images
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${UNPACKDIR}/gpu-k8s-preload-images.service ${D}${systemd_system_unitdir}/
    sed -i -e 's#@LIBEXECDIR@#${libexecdir}#g' ${D}${systemd_system_unitdir}/gpu-k8s-preload-images.service
    sed -i -e 's#@DATADIR@#${datadir}#g' ${D}${libexecdir}/gpu-k8s-preload-images
}

FILES:${PN} += "${datadir}/gpu-k8s"

RDEPENDS:${PN} = "docker"

SYSTEMD_SERVICE:${PN} = "gpu-k8s-preload-images.service"
