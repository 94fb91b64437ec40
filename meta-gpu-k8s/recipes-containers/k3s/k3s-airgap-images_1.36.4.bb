SUMMARY = "k3s airgap images: the container images k3s's own components run"
DESCRIPTION = "The release's k3s-airgap-images tarball (pause, coredns, flannel helper, \
local-path-provisioner, metrics-server, traefik, klipper), pinned by sha256, and a oneshot \
units that hand it to the container runtime, so a node needs no registry for k3s's own \
images: with k3s's containerd the tarball is linked into agent/images before k3s starts (k3s \
imports it), with docker it is loaded with docker load."
# Images of Apache-2.0 (k3s, coredns, flannel, local-path-provisioner, metrics-server,
# pause), MIT (traefik) projects, on busybox/alpine bases (GPL-2.0-only).
LICENSE = "Apache-2.0 & MIT & GPL-2.0-only"
# nooelint: oelint.var.licenseremotefile - a release tarball of images has no license file of its own
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10 \
                    file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302 \
                    file://${COMMON_LICENSE_DIR}/GPL-2.0-only;md5=801f80980d171dd6425610833a22dbe6"

require k3s-release.inc

inherit features_check systemd
REQUIRED_DISTRO_FEATURES = "gpu-k8s systemd"

K3S_AIRGAP_FILE = "k3s-airgap-images-${K3S_ARCH}.tar.zst"
# nooelint: oelint.vars.downloadfilename - K3S_RELEASE holds the version, PV (k3s-release.inc checks they match)
SRC_URI = "${K3S_RELEASE_URL}/${K3S_AIRGAP_FILE};downloadfilename=k3s-airgap-images-${K3S_ARCH}-${K3S_RELEASE}.tar.zst;name=airgap-${K3S_ARCH};unpack=0 \
           file://k3s-airgap-images-load \
           file://k3s-airgap-images.service \
           file://k3s-airgap-images-docker.service \
"

S = "${UNPACKDIR}"

do_configure[noexec] = "1"
do_compile[noexec] = "1"

# Under /usr (read-only, part of the OS update), not /var/lib/rancher (node state).
K3S_AIRGAP_DIR = "${datadir}/k3s/airgap-images"

do_install() {
    install -d ${D}${K3S_AIRGAP_DIR}
    install -m 0644 ${UNPACKDIR}/k3s-airgap-images-${K3S_ARCH}-${K3S_RELEASE}.tar.zst \
        ${D}${K3S_AIRGAP_DIR}/${K3S_AIRGAP_FILE}
    install -d ${D}${libexecdir}/k3s
    install -m 0755 ${UNPACKDIR}/k3s-airgap-images-load ${D}${libexecdir}/k3s/
    sed -i -e 's#@AIRGAP_DIR@#${K3S_AIRGAP_DIR}#g' ${D}${libexecdir}/k3s/k3s-airgap-images-load
    install -d ${D}${systemd_system_unitdir}
    for unit in k3s-airgap-images.service k3s-airgap-images-docker.service; do
        install -m 0644 ${UNPACKDIR}/$unit ${D}${systemd_system_unitdir}/
        sed -i -e 's#@LIBEXECDIR@#${libexecdir}#g' ${D}${systemd_system_unitdir}/$unit
    done
}

FILES:${PN} += "${datadir}/k3s"

SYSTEMD_SERVICE:${PN} = "k3s-airgap-images.service k3s-airgap-images-docker.service"

# zstd: docker 20.10's "docker load" does not read zstd, the loader decompresses it.
RDEPENDS:${PN} = "zstd"
