SUMMARY = "Node-side OS update agent: Mender A/B install, health gate, commit or roll back"
DESCRIPTION = "gpu-k8s-update installs a Mender artifact for the rollout job (idempotent, \
survives its own reboot) and, after the new slot boots, commits it only once docker, the \
kubelet, the node and the GPU device plugin are healthy; otherwise it reboots into the old \
slot. Built from updater/ in this repository."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=8e8dcf3b0f2979e4dc758da3781c2ba4"

# updater/ sits at the repository root, three levels up: fetched as a local directory, so
# every edit changes the file checksums and triggers a rebuild, without network or SRCREV.
# nooelint: oelint.vars.fileextrapaths,oelint.vars.outofcontext - the source is outside the layer, not in files/
FILESEXTRAPATHS:prepend := "${THISDIR}/../../..:"
SRC_URI = "file://updater"

S = "${UNPACKDIR}/updater"

inherit python_setuptools_build_meta systemd gpu_k8s_repo_source
# skipped, not a parse error, where updater/ is missing (a copy of the layer alone)
GPU_K8S_REPO_SOURCE = "updater"

# image-info (below) differs per machine and per release: never share the package between machines.
PACKAGE_ARCH = "${MACHINE_ARCH}"

# image-info, read by the agent on the running slot: the release this root filesystem carries
# and its A/B backend. Mender 4 and later keep the artifact name only in their database on
# /data, written at commit, so a new slot cannot learn its own release from Mender before the
# gate commits it. The backend follows the Mender integration this build configured (never a
# guess on the board): meta-mender-tegra's native scheme on the Orin and Thor, GRUB's or
# U-Boot's environment with the stock rootfs-image module elsewhere.
GPU_K8S_UPDATE_AB_BACKEND ??= "${@gpu_k8s_update_ab_backend(d)}"

def gpu_k8s_update_ab_backend(d):
    if d.getVar('TEGRA_MENDER_SCHEME') == 'native':
        return 'mender-tegra'
    features = (d.getVar('MENDER_FEATURES') or '').split()
    if 'mender-grub' in features:
        return 'mender-grub'
    if 'mender-uboot' in features:
        return 'mender-uboot'
    return ''

do_install:append() {
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${S}/systemd/gpu-k8s-update-gate.service ${S}/systemd/gpu-k8s-update-report.service \
        ${D}${systemd_system_unitdir}/
}

do_install:append:gpu-k8s-mender() {
    if [ -z "${GPU_K8S_UPDATE_AB_BACKEND}" ]; then
        bbfatal "gpu-k8s-update: this build configures no Mender integration the agent drives (no mender-grub or" \
            "mender-uboot in MENDER_FEATURES, no native TEGRA_MENDER_SCHEME): set GPU_K8S_UPDATE_AB_BACKEND to" \
            "mender-grub, mender-uboot or mender-tegra"
    fi
    install -d ${D}${datadir}/gpu-k8s-update
    printf 'artifact_name=%s\nab_backend=%s\n' "${MENDER_ARTIFACT_NAME}" "${GPU_K8S_UPDATE_AB_BACKEND}" \
        > ${D}${datadir}/gpu-k8s-update/image-info
}
# (${datadir}/${BPN} is in FILES:${PN} by default.)

# Standard library only. Packages per oe-core's python3 manifest: argparse, subprocess,
# urllib (core), dataclasses (profile), http.client (netclient), socket (io), shlex (shell).
RDEPENDS:${PN} = " \
    python3-core \
    python3-io \
    python3-json \
    python3-logging \
    python3-netclient \
    python3-profile \
    python3-shell \
"

# The agent drives mender-update, which brings the bootloader environment tools (fw_printenv
# or grub-mender-grubenv). Only where the A/B opt-in (gpu_k8s_mender class, its
# gpu-k8s-mender override) pulls in meta-mender: elsewhere nothing provides it, and the
# layer must still resolve every recipe (bitbake world, yocto-check-layer).
# nooelint: oelint.vars.specific - gpu-k8s-mender is a DISTROOVERRIDES entry (the A/B opt-in), not a machine
RDEPENDS:${PN}:append:gpu-k8s-mender = " mender-update ${GPU_K8S_UPDATE_AB_RDEPENDS}"
# Jetson Orin and Thor: the agent reads the slots with nvbootctrl and commits and rolls back
# through meta-mender-tegra's tegra-rootfs-image module (which also brings nvbootctrl, the
# OsIndications helper and mender-flash); never installed without them.
GPU_K8S_UPDATE_AB_RDEPENDS = "${@'tegra-rootfs-update-module tegra-redundant-boot-base' if d.getVar('GPU_K8S_UPDATE_AB_BACKEND') == 'mender-tegra' else ''}"

# The gate; and the report of the data partition's check, each time k3s starts.
SYSTEMD_SERVICE:${PN} = "gpu-k8s-update-gate.service gpu-k8s-update-report.service"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"
