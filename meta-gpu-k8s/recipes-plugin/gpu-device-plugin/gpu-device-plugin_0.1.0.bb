SUMMARY = "Kubernetes device plugin that advertises NVIDIA GPUs as nvidia.com/gpu"
DESCRIPTION = "Python device plugin for the kubelet: Tegra discovery on Jetson, NVML on \
x86-64, simulated GPUs for QEMU smoke tests. Built from plugin/ in this repository."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=8e8dcf3b0f2979e4dc758da3781c2ba4"

# plugin/ sits at the repository root, three levels up: fetched as a local directory, so
# every edit changes the file checksums and triggers a rebuild, without network or SRCREV.
# nooelint: oelint.vars.fileextrapaths,oelint.vars.outofcontext - the source is outside the layer, not in files/
FILESEXTRAPATHS:prepend := "${THISDIR}/../../..:"
SRC_URI = "file://plugin \
           file://gpu-device-plugin.yaml \
"

S = "${UNPACKDIR}/plugin"

inherit python_setuptools_build_meta systemd gpu_k8s_repo_source
# skipped, not a parse error, where plugin/ is missing (a copy of the layer alone)
GPU_K8S_REPO_SOURCE = "plugin"

# The default config differs per machine (files/tegra210 for the Nano, files/tegra for the
# other Jetsons, files/qemuall); its name is unique
# because FILESEXTRAPATHS above also searches the repository root.
PACKAGE_ARCH = "${MACHINE_ARCH}"

do_install:append() {
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${S}/systemd/gpu-device-plugin.service ${S}/systemd/gpu-dra-driver.service \
        ${D}${systemd_system_unitdir}/
    # the DRA driver's DeviceClasses and admission policy: k3s auto-deploys them on servers
    # (gpu-k8s-k3s-manifests.service copies this directory into its manifests at boot)
    install -d ${D}${datadir}/gpu-k8s/k3s-manifests
    install -m 0644 ${S}/deploy/gpu-dra.yaml ${D}${datadir}/gpu-k8s/k3s-manifests/
    install -d ${D}${sysconfdir}/gpu-device-plugin
    install -m 0644 ${UNPACKDIR}/gpu-device-plugin.yaml ${D}${sysconfdir}/gpu-device-plugin/config.yaml
}

FILES:${PN} += "${datadir}/gpu-k8s/k3s-manifests/gpu-dra.yaml"
CONFFILES:${PN} = "${sysconfdir}/gpu-device-plugin/config.yaml"

# Stdlib packages per oe-core's python3 manifest: concurrent.futures (asyncio), hashlib (crypt),
# dataclasses (profile), glob (shell), socket/tempfile (io), http.server (netclient, netserver);
# the DRA driver's API client: base64, urllib (netclient), socket and ssl (io);
# nvidia-ml-py (python3-nvidia-ml-py) is optional: the packagegroup adds it with the x86-64 NVIDIA stack.
# The plugin speaks gRPC with its own HTTP/2 code and wire format: no grpcio or protobuf on
# the node, only meta-python's hpack for header blocks.
RDEPENDS:${PN} = " \
    python3-asyncio \
    python3-core \
    python3-crypt \
    python3-ctypes \
    python3-hpack \
    python3-io \
    python3-json \
    python3-logging \
    python3-math \
    python3-netclient \
    python3-netserver \
    python3-profile \
    python3-pyyaml \
    python3-shell \
    python3-threading \
"

SYSTEMD_SERVICE:${PN} = "gpu-device-plugin.service gpu-dra-driver.service"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"
