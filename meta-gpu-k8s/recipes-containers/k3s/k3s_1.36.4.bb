SUMMARY = "k3s: lightweight Kubernetes, the official static release binary"
DESCRIPTION = "Installs the k3s binary that k3s publishes for the release (containerd, runc, \
flannel, cri-dockerd and the k3s-root userspace bundled), pinned by sha256, with systemd units \
for the server (k3s-server) and the agent (k3s-agent). Replaces meta-virtualization's k3s, \
which kirkstone's Go cannot build in any supported version."
# The binary bundles k3s-root (busybox, iptables, ipset, conntrack-tools, socat, ...): GPL parts.
LICENSE = "Apache-2.0 & GPL-2.0-only & GPL-2.0-or-later"
# nooelint: oelint.var.licenseremotefile - a release binary has no license file of its own
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10 \
                    file://${COMMON_LICENSE_DIR}/GPL-2.0-only;md5=801f80980d171dd6425610833a22dbe6 \
                    file://${COMMON_LICENSE_DIR}/GPL-2.0-or-later;md5=fed54355545ffd980b814dab4a3b312c"

require k3s-release.inc

# Only with the distro feature (kas/include/common.yml): adding the layer alone keeps
# meta-virtualization's k3s.
inherit features_check systemd
REQUIRED_DISTRO_FEATURES = "gpu-k8s systemd"

K3S_ASSET = "k3s"
K3S_ASSET:aarch64 = "k3s-arm64"
# Per-architecture, per-version download names: the amd64 and arm64 binaries never share a
# DL_DIR entry, and a version bump never reuses an old download.
K3S_DOWNLOAD = "k3s-${K3S_ARCH}-${K3S_RELEASE}"
# nooelint: oelint.vars.downloadfilename - K3S_RELEASE holds the version, PV (k3s-release.inc checks they match)
SRC_URI = "${K3S_RELEASE_URL}/${K3S_ASSET};downloadfilename=${K3S_DOWNLOAD};name=k3s-${K3S_ARCH} \
           file://k3s.service \
           file://k3s-agent.service \
           file://k3s-agent-configured \
"

S = "${UNPACKDIR}"

do_configure[noexec] = "1"
do_compile[noexec] = "1"

do_install() {
    install -d ${D}${bindir}
    install -m 0755 ${UNPACKDIR}/${K3S_DOWNLOAD} ${D}${bindir}/k3s
    # k3s is a multi-call binary. No ctr link: docker's containerd owns ${bindir}/ctr (use "k3s ctr").
    ln -s k3s ${D}${bindir}/kubectl
    ln -s k3s ${D}${bindir}/crictl

    install -d ${D}${libexecdir}/k3s
    install -m 0755 ${UNPACKDIR}/k3s-agent-configured ${D}${libexecdir}/k3s/
    install -d ${D}${systemd_system_unitdir}
    for unit in k3s.service k3s-agent.service; do
        install -m 0644 ${UNPACKDIR}/$unit ${D}${systemd_system_unitdir}/
        sed -i -e 's#@BINDIR@#${bindir}#g' -e 's#@LIBEXECDIR@#${libexecdir}#g' \
            -e 's#@BASE_SBINDIR@#${base_sbindir}#g' ${D}${systemd_system_unitdir}/$unit
    done
}

PACKAGES =+ "${PN}-server ${PN}-agent"
FILES:${PN}-server += "${systemd_system_unitdir}/k3s.service"
FILES:${PN}-agent += "${systemd_system_unitdir}/k3s-agent.service ${libexecdir}/k3s/k3s-agent-configured"
FILES:${PN} += "${bindir}/k3s ${bindir}/kubectl ${bindir}/crictl"

SYSTEMD_PACKAGES = "${PN}-server ${PN}-agent"
SYSTEMD_SERVICE:${PN}-server = "k3s.service"
SYSTEMD_SERVICE:${PN}-agent = "k3s-agent.service"
# Enabled: an agent that is not told where its server is stays inactive (ExecCondition),
# one that is starts on its own, with no hand step on the node.
SYSTEMD_AUTO_ENABLE = "enable"

RDEPENDS:${PN}-server = "${PN}"
RDEPENDS:${PN}-agent = "${PN}"
# The units run modprobe; iptables: k3s prefers the host's (legacy) iptables, as docker does.
RDEPENDS:${PN} = "iptables kmod"

# Kernel modules k3s loads (modular kernels, x86-64); built-in options need no package.
# Kept equal to x86_64_kernel_modules in k3s-kernel-requirements.yaml (a layer test checks it).
RRECOMMENDS:${PN} = " \
    kernel-module-br-netfilter \
    kernel-module-ip-set \
    kernel-module-ip-set-hash-ip \
    kernel-module-ip-set-hash-ipport \
    kernel-module-ip-set-hash-ipportnet \
    kernel-module-ip-set-hash-net \
    kernel-module-nfnetlink-log \
    kernel-module-vxlan \
    kernel-module-xt-addrtype \
    kernel-module-xt-comment \
    kernel-module-xt-conntrack \
    kernel-module-xt-mark \
    kernel-module-xt-masquerade \
    kernel-module-xt-multiport \
    kernel-module-xt-nat \
    kernel-module-xt-nflog \
    kernel-module-xt-physdev \
    kernel-module-xt-set \
    kernel-module-xt-statistic \
"

RCONFLICTS:${PN} = "kubectl"

# A prebuilt, statically linked and stripped Go binary: nothing to strip or split
# (with both set, the already-stripped check does not run; no symbols, so no ldflags finding).
INHIBIT_PACKAGE_STRIP = "1"
INHIBIT_PACKAGE_DEBUG_SPLIT = "1"
