SUMMARY = "system-upgrade-controller for k3s servers and the images rollout jobs run"
DESCRIPTION = "The system-upgrade-controller manifest that k3s auto-deploys on server \
nodes (main package). The -images package: loads into docker, before k3s starts, the upgrade image \
(localhost/gpu-k8s-upgrade:latest, busybox; its job runs chroot /host gpu-k8s-update) and, \
when the build was given them, the controller and kubectl images, so air-gapped fleets update."
HOMEPAGE = "https://github.com/rancher/system-upgrade-controller"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - our own manifest and scripts, MIT; the controller's images are not built here
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://system-upgrade-controller.yaml \
           file://gpu-k8s-k3s-manifests.service \
           file://gpu-k8s-fleet-images.sh \
           file://gpu-k8s-fleet-images.service \
"

S = "${UNPACKDIR}"

inherit systemd

# The upgrade image's rootfs is built for this machine.
PACKAGE_ARCH = "${MACHINE_ARCH}"

# K3S_VERSION: the drain step's kubectl follows the k3s line the images run.
require recipes-containers/k3s/k3s_version.inc

GPU_K8S_SUC_IMAGE ?= "rancher/system-upgrade-controller:v${PV}"
# The kubectl image the controller's jobs cordon and drain with: the same Kubernetes minor
# as our k3s (v0.20.1's own default, v1.30.3, is six minors behind a 1.36 API server).
GPU_K8S_SUC_KUBECTL_IMAGE ?= "rancher/kubectl:v${K3S_VERSION}"
GPU_K8S_UPGRADE_IMAGE ?= "localhost/gpu-k8s-upgrade:latest"
GPU_K8S_UPGRADE_ROOTFS ?= "gpu-k8s-smoke-container"
# Air-gapped fleets: a `docker save` archive of the two images above, made on a host with a
# registry (docs/layer.md), and its sha256. Without it, nodes pull them on first use.
GPU_K8S_FLEET_IMAGES_ARCHIVE ?= ""
GPU_K8S_FLEET_IMAGES_SHA256 ?= ""

do_install[depends] += "${GPU_K8S_UPGRADE_ROOTFS}:do_image_complete"
do_install[file-checksums] += "${@'%s:True' % d.getVar('GPU_K8S_FLEET_IMAGES_ARCHIVE') if d.getVar('GPU_K8S_FLEET_IMAGES_ARCHIVE') else ''}"
do_install() {
    install -d ${D}${datadir}/gpu-k8s/k3s-manifests ${D}${datadir}/gpu-k8s/images/fleet
    sed -e 's#@SUC_IMAGE@#${GPU_K8S_SUC_IMAGE}#g' \
        -e 's#@SUC_VERSION@#v${PV}#g' \
        -e 's#@KUBECTL_IMAGE@#${GPU_K8S_SUC_KUBECTL_IMAGE}#g' \
        ${UNPACKDIR}/system-upgrade-controller.yaml \
        > ${D}${datadir}/gpu-k8s/k3s-manifests/system-upgrade-controller.yaml
    chmod 0644 ${D}${datadir}/gpu-k8s/k3s-manifests/system-upgrade-controller.yaml

    install -m 0644 ${DEPLOY_DIR_IMAGE}/${GPU_K8S_UPGRADE_ROOTFS}-${MACHINE}.tar.bz2 \
        ${D}${datadir}/gpu-k8s/images/gpu-k8s-upgrade.tar.bz2
    archive="${GPU_K8S_FLEET_IMAGES_ARCHIVE}"
    if [ -n "$archive" ]; then
        if [ ! -f "$archive" ]; then
            bbfatal "GPU_K8S_FLEET_IMAGES_ARCHIVE names $archive, which is not a file (make it with docker save, docs/layer.md)"
        fi
        actual=$(sha256sum "$archive" | cut -d' ' -f1)
        if [ "$actual" != "${GPU_K8S_FLEET_IMAGES_SHA256}" ]; then
            bbfatal "$archive has sha256 $actual, GPU_K8S_FLEET_IMAGES_SHA256 says '${GPU_K8S_FLEET_IMAGES_SHA256}': set it to the archive's sha256"
        fi
        # A docker-archive names its images in manifest.json: an air-gapped node can only
        # drain with the kubectl image the controller is told to use.
        for image in ${GPU_K8S_SUC_IMAGE} ${GPU_K8S_SUC_KUBECTL_IMAGE}; do
            if ! tar -xOf "$archive" manifest.json | grep -q "\"$image\""; then
                bbfatal "$archive does not hold $image (docker save it too, docs/layer.md), or air-gapped nodes cannot run rollout jobs"
            fi
        done
        install -m 0644 "$archive" ${D}${datadir}/gpu-k8s/images/fleet/system-upgrade-controller.tar
    fi

    install -d ${D}${libexecdir} ${D}${systemd_system_unitdir}
    install -m 0755 ${UNPACKDIR}/gpu-k8s-fleet-images.sh ${D}${libexecdir}/gpu-k8s-fleet-images
    sed -i -e 's#@DATADIR@#${datadir}#g' -e 's#@UPGRADE_IMAGE@#${GPU_K8S_UPGRADE_IMAGE}#g' \
        ${D}${libexecdir}/gpu-k8s-fleet-images
    install -m 0644 ${UNPACKDIR}/gpu-k8s-fleet-images.service ${UNPACKDIR}/gpu-k8s-k3s-manifests.service \
        ${D}${systemd_system_unitdir}/
    sed -i -e 's#@DATADIR@#${datadir}#g' -e 's#@LIBEXECDIR@#${libexecdir}#g' \
        ${D}${systemd_system_unitdir}/gpu-k8s-fleet-images.service \
        ${D}${systemd_system_unitdir}/gpu-k8s-k3s-manifests.service
}

PACKAGES =+ "${PN}-images"
SYSTEMD_PACKAGES = "${PN} ${PN}-images"
SYSTEMD_SERVICE:${PN} = "gpu-k8s-k3s-manifests.service"
SYSTEMD_SERVICE:${PN}-images = "gpu-k8s-fleet-images.service"

FILES:${PN} += "${datadir}/gpu-k8s/k3s-manifests ${systemd_system_unitdir}/gpu-k8s-k3s-manifests.service"
FILES:${PN}-images += "${datadir}/gpu-k8s/images ${libexecdir}/gpu-k8s-fleet-images \
                      ${systemd_system_unitdir}/gpu-k8s-fleet-images.service"

RDEPENDS:${PN} = "${PN}-images"
RDEPENDS:${PN}-images = "docker"
