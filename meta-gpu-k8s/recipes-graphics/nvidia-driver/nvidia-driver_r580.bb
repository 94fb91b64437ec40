SUMMARY = "NVIDIA driver userspace (R580, x86-64): CUDA driver, NVML, GSP fw, persistenced"
DESCRIPTION = "The compute part of NVIDIA's driver, taken unmodified from NVIDIA's .run \
installer of exactly the version of nvidia-open-gpu-kernel-modules: libcuda with its PTX JIT, \
NVVM and debugger libraries, libnvidia-ml (NVML), the GSP firmware the open kernel modules \
load, nvidia-smi, nvidia-modprobe, and nvidia-persistenced with libnvidia-cfg and a unit. \
No OpenGL/Vulkan/X libraries: the node \
is headless and they would clash with mesa. The licence is NVIDIA's, not open: building needs \
LICENSE_FLAGS_ACCEPTED += \"nvidia-driver\" (docs/layer.md)."
HOMEPAGE = "https://www.nvidia.com/en-us/drivers/unix/"
LICENSE = "NVIDIA-Proprietary"
# The licence text shipped in the .run; its md5 is pinned with the release
# (nvidia-driver-version.inc, required below).
LIC_FILES_CHKSUM = "file://LICENSE;md5=${NVIDIA_DRIVER_LICENSE_MD5}"
# Not an SPDX licence: the text comes from the package itself.
NO_GENERIC_LICENSE[NVIDIA-Proprietary] = "LICENSE"
# Redistribution is allowed only unmodified, under NVIDIA's terms: the builder accepts them.
LICENSE_FLAGS = "nvidia-driver"

# The exact release (PV) is in the version file both this recipe and the kernel modules read.
require nvidia-driver-version.inc

PV = "${NVIDIA_DRIVER_VERSION}"

NVIDIA_RUN = "NVIDIA-Linux-x86_64-${PV}.run"
# The installer is a self-extracting shell archive: fetched as is (unpack=0) and extracted below.
# Where it is published depends on the release line (data-centre or production): the version
# file says.
SRC_URI = "${NVIDIA_DRIVER_RUN_BASE_URI}/${NVIDIA_RUN};unpack=0 \
           file://nvidia-persistenced.service \
"
SRC_URI[sha256sum] = "${NVIDIA_DRIVER_RUN_SHA256}"

S = "${UNPACKDIR}/NVIDIA-Linux-x86_64-${PV}"

COMPATIBLE_HOST = "x86_64.*-linux"
COMPATIBLE_HOST:libc-musl = "null"

inherit systemd useradd

# --extract-only unpacks the payload; nothing of the installer runs. First among do_unpack's
# postfuncs: the S check and the source date stamp read what it extracts.
nvidia_driver_extract() {
    rm -rf ${S}
    sh ${DL_DIR}/${NVIDIA_RUN} --extract-only --target ${S}
}
do_unpack[postfuncs] =+ "nvidia_driver_extract"

do_configure[noexec] = "1"
do_compile[noexec] = "1"

# library -> SONAME programs and the container toolkit load (libcuda.so.1, libnvidia-ml.so.1).
NVIDIA_LIBRARIES = " \
    libcuda:libcuda.so.1 \
    libnvidia-ml:libnvidia-ml.so.1 \
    libnvidia-ptxjitcompiler:libnvidia-ptxjitcompiler.so.1 \
    libnvidia-nvvm:libnvidia-nvvm.so.4 \
    libnvidia-gpucomp: \
    libcudadebugger:libcudadebugger.so.1 \
    libnvidia-cfg:libnvidia-cfg.so.1 \
"
NVIDIA_TOOLS = "nvidia-smi nvidia-persistenced nvidia-debugdump nvidia-cuda-mps-control nvidia-cuda-mps-server"

do_install() {
    install -d ${D}${libdir} ${D}${bindir}
    for entry in ${NVIDIA_LIBRARIES}; do
        name=${entry%%:*}
        soname=${entry#*:}
        install -m 0755 ${S}/$name.so.${PV} ${D}${libdir}/
        if [ -n "$soname" ]; then
            ln -sf $name.so.${PV} ${D}${libdir}/$soname
        fi
    done
    # NVVM for older NVVM IR, named by SONAME only; not in every release.
    if [ -e ${S}/libnvidia-nvvm70.so.4 ]; then
        install -m 0755 ${S}/libnvidia-nvvm70.so.4 ${D}${libdir}/
    fi
    # Programs that dlopen the driver by its bare name (libcuda.so) find it too.
    ln -sf libcuda.so.1 ${D}${libdir}/libcuda.so
    ln -sf libnvidia-ml.so.1 ${D}${libdir}/libnvidia-ml.so

    for tool in ${NVIDIA_TOOLS}; do
        install -m 0755 ${S}/$tool ${D}${bindir}/
    done
    # setuid root: libcuda runs it to create /dev/nvidia* nodes the kernel module does not.
    install -m 4755 ${S}/nvidia-modprobe ${D}${bindir}/

    # nvidia.ko asks for nvidia/<version>/gsp_*.bin: the same version, or no GPU comes up.
    install -d ${D}${nonarch_base_libdir}/firmware/nvidia/${PV}
    install -m 0644 ${S}/firmware/gsp_*.bin ${D}${nonarch_base_libdir}/firmware/nvidia/${PV}/

    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${UNPACKDIR}/nvidia-persistenced.service ${D}${systemd_system_unitdir}/
    sed -i -e 's#@BINDIR@#${bindir}#g' ${D}${systemd_system_unitdir}/nvidia-persistenced.service
}

PACKAGES = "${PN}-libcuda ${PN}-libnvidia-ml ${PN}-firmware ${PN}-persistenced ${PN}-tools ${PN}"
FILES:${PN}-libcuda += "${libdir}/libcuda.so* \
    ${libdir}/libnvidia-ptxjitcompiler.so* \
    ${libdir}/libnvidia-nvvm.so* \
    ${libdir}/libnvidia-nvvm70.so* \
    ${libdir}/libnvidia-gpucomp.so* \
    ${libdir}/libcudadebugger.so* \
"
FILES:${PN}-libnvidia-ml += "${libdir}/libnvidia-ml.so*"
FILES:${PN}-firmware += "${nonarch_base_libdir}/firmware/nvidia/${PV}"
# nvidia-persistenced dlopens libnvidia-cfg.so.1 at start and exits without it.
FILES:${PN}-persistenced += "${bindir}/nvidia-persistenced \
    ${libdir}/libnvidia-cfg.so* \
    ${systemd_system_unitdir}/nvidia-persistenced.service \
"
FILES:${PN}-tools += "${bindir}"
ALLOW_EMPTY:${PN} = "1"

SYSTEMD_PACKAGES = "${PN}-persistenced"
SYSTEMD_SERVICE:${PN}-persistenced = "nvidia-persistenced.service"
SYSTEMD_AUTO_ENABLE:${PN}-persistenced = "enable"
# The daemon drops to this user after opening the GPUs (--user), as NVIDIA's sample unit does.
USERADD_PACKAGES = "${PN}-persistenced"
USERADD_PARAM:${PN}-persistenced = "--system --no-create-home --home-dir /run/nvidia-persistenced \
    --shell /sbin/nologin --user-group nvidia-persistenced"

# Library packages keep their names (not renamed after a SONAME), so the image checks find them.
DEBIAN_NOAUTONAME:${PN}-libcuda = "1"
DEBIAN_NOAUTONAME:${PN}-libnvidia-ml = "1"
DEBIAN_NOAUTONAME:${PN}-persistenced = "1"

# The driver: kernel side and userspace of one version, and the firmware nvidia.ko loads.
RDEPENDS:${PN}-libcuda = "${PN}-firmware nvidia-open-gpu-kernel-modules"
RDEPENDS:${PN}-libnvidia-ml = "${PN}-firmware nvidia-open-gpu-kernel-modules"
RDEPENDS:${PN}-tools = "${PN}-libnvidia-ml"
RDEPENDS:${PN}-persistenced = "${PN}-libnvidia-ml"
RDEPENDS:${PN} = "${PN}-libcuda ${PN}-libnvidia-ml ${PN}-persistenced ${PN}-tools"

# NVIDIA's binaries as shipped: no stripping or debug split (the licence allows no changes),
# no shlib provides (nothing links them at build time), no checks written for our own builds.
INHIBIT_PACKAGE_STRIP = "1"
INHIBIT_PACKAGE_DEBUG_SPLIT = "1"
INHIBIT_SYSROOT_STRIP = "1"
EXCLUDE_FROM_SHLIBS = "1"
# nooelint: oelint.vars.insaneskip - NVIDIA's prebuilt libraries; libcuda.so is the name programs dlopen, not a dev link
INSANE_SKIP:${PN}-libcuda = "already-stripped ldflags textrel dev-so"
# nooelint: oelint.vars.insaneskip - NVIDIA's prebuilt library; libnvidia-ml.so is dlopened by that name
INSANE_SKIP:${PN}-libnvidia-ml = "already-stripped ldflags dev-so"
# nooelint: oelint.vars.insaneskip - NVIDIA's prebuilt programs, which dlopen the libraries above
INSANE_SKIP:${PN}-tools = "already-stripped ldflags file-rdeps"
# nooelint: oelint.vars.insaneskip - NVIDIA's prebuilt daemon and the library it dlopens
INSANE_SKIP:${PN}-persistenced = "already-stripped ldflags file-rdeps dev-so"
# nooelint: oelint.vars.insaneskip - the GSP firmware images are RISC-V ELF files for the GPU's own processor
INSANE_SKIP:${PN}-firmware = "arch already-stripped"
