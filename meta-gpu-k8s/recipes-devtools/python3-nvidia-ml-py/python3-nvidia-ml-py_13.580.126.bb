SUMMARY = "NVIDIA's Python bindings for NVML (pynvml)"
DESCRIPTION = "nvidia-ml-py: the pynvml module, a ctypes binding that loads libnvidia-ml.so.1 \
at run time. The 13.580 line matches the R580 driver the x86-64 image carries; NVML keeps old \
entry points, and a binding newer than the driver only loses functions the driver lacks."
HOMEPAGE = "https://pypi.org/project/nvidia-ml-py/"
LICENSE = "BSD-3-Clause"
LIC_FILES_CHKSUM = "file://pynvml.py;beginline=1;endline=27;md5=5b6a2fe668739c259facb7644623b7d2"

# The sdist's content-addressed URL on PyPI; sha256 as PyPI's simple index lists it.
SRC_URI = "https://files.pythonhosted.org/packages/f7/13/a376a418899221c5716de3f954e4621f7c6f2008350e86636003375c397f/nvidia_ml_py-${PV}.tar.gz"
SRC_URI[sha256sum] = "88853c29d0bf20e5ae11f38172e672c17ebb14a50b45769bc143ff2616435c40"

S = "${UNPACKDIR}/nvidia_ml_py-${PV}"

inherit allarch python3-dir

# One pure-Python module. Its setup.py still imports distutils, which Python 3.12 removed:
# the module and the metadata the sdist ships are installed as they are instead.
do_configure[noexec] = "1"
do_compile[noexec] = "1"

do_install() {
    install -d ${D}${PYTHON_SITEPACKAGES_DIR}/nvidia_ml_py-${PV}.egg-info
    install -m 0644 ${S}/pynvml.py ${D}${PYTHON_SITEPACKAGES_DIR}/
    install -m 0644 ${S}/nvidia_ml_py.egg-info/PKG-INFO ${S}/nvidia_ml_py.egg-info/top_level.txt \
        ${D}${PYTHON_SITEPACKAGES_DIR}/nvidia_ml_py-${PV}.egg-info/
}

FILES:${PN} += "${PYTHON_SITEPACKAGES_DIR}"

RDEPENDS:${PN} = "python3-core python3-ctypes python3-threading"
