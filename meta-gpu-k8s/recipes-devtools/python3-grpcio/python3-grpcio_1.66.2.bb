SUMMARY = "gRPC for Python, newer than kirkstone's 1.45 so an idle device plugin sleeps"
DESCRIPTION = "grpcio 1.45-1.48 (meta-python kirkstone carries 1.45.0) wakes every 1 ms \
while a server is idle: the device plugin then costs about 2 % of a Jetson Nano core doing \
nothing. From 1.51 an idle server sleeps. Built from the PyPI source with its bundled \
BoringSSL, abseil, c-ares, re2 and zlib, as meta-python builds 1.45, because kirkstone's \
abseil-cpp and re2 are too old for this gRPC."
HOMEPAGE = "https://grpc.io/"
SECTION = "devel/python"
LICENSE = "Apache-2.0 & BSD-3-Clause"
LIC_FILES_CHKSUM = "file://LICENSE;md5=731e401b36f8077ae0c134b59be5c906"

SRC_URI[sha256sum] = "563588c587b75c34b928bc428548e5b00ea38c46972181a4d8b75ba7e3f24231"

inherit pypi setuptools3 features_check

# Only a distro that opts into this layer's choices (DISTRO_FEATURES gpu-k8s) gets this version;
# without it the recipe is skipped and meta-python's python3-grpcio is used as before. With it,
# this layer's higher BBFILE_PRIORITY makes this recipe the provider (kas/include/common.yml
# also names the version, so bitbake warns if it ever goes missing).
REQUIRED_DISTRO_FEATURES = "gpu-k8s"

# grpc's setup.py: our compiler flags replace its defaults (gcc 11 defaults to C++17/C17,
# enough for this release); glibc symbols are not pinned to an old manylinux baseline.
export GRPC_PYTHON_CFLAGS = ""
export GRPC_PYTHON_DISABLE_LIBC_COMPATIBILITY = "1"

# BoringSSL's assembly for the two architectures this layer builds; elsewhere none.
BORING_SSL_PLATFORM ?= "unsupported"
BORING_SSL_PLATFORM:x86-64 = "linux-x86_64"
BORING_SSL_PLATFORM:aarch64 = "linux-aarch64"
BORING_SSL_ASM ?= "0"
BORING_SSL_ASM:x86-64 = "1"
BORING_SSL_ASM:aarch64 = "1"
export GRPC_BUILD_WITH_BORING_SSL_ASM = "${BORING_SSL_ASM}"
export GRPC_BUILD_OVERRIDE_BORING_SSL_ASM_PLATFORM = "${BORING_SSL_PLATFORM}"

do_compile:prepend() {
    export GRPC_PYTHON_BUILD_EXT_COMPILER_JOBS="${@oe.utils.parallel_make(d, False)}"
}

# The build runs several compilers in parallel from setup.py; ccache only gets in the way.
CCACHE_DISABLE = "1"
CLEANBROKEN = "1"

# concurrent.futures (the server's thread pool) is in python3-asyncio per oe-core's manifest.
RDEPENDS:${PN} = "python3-asyncio python3-logging python3-threading"

CVE_PRODUCT += "grpc:grpc"
