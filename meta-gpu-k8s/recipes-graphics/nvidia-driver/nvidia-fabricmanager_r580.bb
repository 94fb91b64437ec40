SUMMARY = "NVIDIA Fabric Manager (R580, x86-64) for NVSwitch systems"
DESCRIPTION = "nv-fabricmanager and nvswitch-audit with NVIDIA's fabric topologies and \
configuration, of exactly the driver's version, and a unit that starts only where nvidia.ko \
found an NVSwitch (HGX/DGX A100, H100, H200): without it CUDA fails with 'system not yet \
initialized' there. Taken unmodified from NVIDIA's redistributable archive."
HOMEPAGE = "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/"
LICENSE = "NVIDIA-Proprietary"
# The archive's own licence text; its md5 is pinned with the archive (nvidia-driver-version.inc).
LIC_FILES_CHKSUM = "file://LICENSE;md5=${NVIDIA_FABRICMANAGER_LICENSE_MD5}"
NO_GENERIC_LICENSE[NVIDIA-Proprietary] = "LICENSE"
LICENSE_FLAGS = "nvidia-driver"

# Fabric Manager refuses a driver of another version: PV and the checksum come from the one file.
require nvidia-driver-version.inc

PV = "${NVIDIA_DRIVER_VERSION}"

NVIDIA_FABRICMANAGER_ARCHIVE = "fabricmanager-linux-x86_64-${PV}-archive"
SRC_URI = "https://developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/linux-x86_64/${NVIDIA_FABRICMANAGER_ARCHIVE}.tar.xz \
           file://nvidia-fabricmanager.service \
"
SRC_URI[sha256sum] = "${NVIDIA_FABRICMANAGER_SHA256}"

S = "${UNPACKDIR}/${NVIDIA_FABRICMANAGER_ARCHIVE}"

inherit systemd

COMPATIBLE_HOST = "x86_64.*-linux"
COMPATIBLE_HOST:libc-musl = "null"

# Without a checksum pinned for the driver version (a production-line release has no Fabric
# Manager archive): skipped with the reason, and the knob that puts it in the image defaults to
# off (classes/gpu_k8s_nvidia.bbclass).
# nooelint: oelint.task.noanonpython - an unpinned download must be skipped with the reason, not fetched unchecked
python () {
    if not d.getVar('NVIDIA_FABRICMANAGER_SHA256') or not d.getVar('NVIDIA_FABRICMANAGER_LICENSE_MD5'):
        raise bb.parse.SkipRecipe('no sha256/licence md5 pinned for Fabric Manager %s (NVIDIA_FABRICMANAGER_SHA256 '
                                  'and NVIDIA_FABRICMANAGER_LICENSE_MD5, recipes-graphics/nvidia-driver/'
                                  'nvidia-driver-version.inc)' % d.getVar('PV'))
}

do_configure[noexec] = "1"
do_compile[noexec] = "1"

# The archive's bin/, etc/ and share/nvidia/nvswitch/ go where the shipped fabricmanager.cfg
# looks (TOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch). NVIDIA's start script and unit
# (bin/nvidia-fabricmanager-start.sh, systemd/) are left out: besides starting nv-fabricmanager
# they only bring up NVLSM on NVLink 5 systems, which this layer does not carry.
do_install() {
    install -d ${D}${bindir} ${D}${datadir}/nvidia/nvswitch ${D}${systemd_system_unitdir}
    install -m 0755 ${S}/bin/nv-fabricmanager ${S}/bin/nvswitch-audit ${D}${bindir}/
    install -m 0644 ${S}/etc/fabricmanager.cfg ${D}${datadir}/nvidia/nvswitch/
    cp -R --no-preserve=ownership ${S}/share/nvidia/nvswitch/. ${D}${datadir}/nvidia/nvswitch/
    install -m 0644 ${UNPACKDIR}/nvidia-fabricmanager.service ${D}${systemd_system_unitdir}/
    sed -i -e 's#@BINDIR@#${bindir}#g' -e 's#@DATADIR@#${datadir}#g' \
        ${D}${systemd_system_unitdir}/nvidia-fabricmanager.service
}

FILES:${PN} += "${datadir}/nvidia/nvswitch"
CONFFILES:${PN} = "${datadir}/nvidia/nvswitch/fabricmanager.cfg"

SYSTEMD_SERVICE:${PN} = "nvidia-fabricmanager.service"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"

# It talks to the NVSwitches and GPUs through nvidia.ko of its own version. nv-fabricmanager
# also links libz.so.1 (its ELF NEEDED list), named here because file-rdeps is skipped below.
RDEPENDS:${PN} = "nvidia-driver-libnvidia-ml nvidia-open-gpu-kernel-modules zlib"

# NVIDIA's binaries as shipped (the licence allows no changes).
INHIBIT_PACKAGE_STRIP = "1"
INHIBIT_PACKAGE_DEBUG_SPLIT = "1"
INHIBIT_SYSROOT_STRIP = "1"
EXCLUDE_FROM_SHLIBS = "1"
# nooelint: oelint.vars.insaneskip - NVIDIA's prebuilt programs
INSANE_SKIP:${PN} = "already-stripped ldflags file-rdeps"
