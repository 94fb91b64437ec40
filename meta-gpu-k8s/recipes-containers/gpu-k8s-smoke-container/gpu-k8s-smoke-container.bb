SUMMARY = "Minimal busybox container rootfs for the smoke test and the k3s pause image"
DESCRIPTION = "Root filesystem tarball with /bin/sh and sleep. gpu-k8s-preload-images imports \
it into docker at boot as localhost/gpu-k8s-smoke:latest and localhost/gpu-k8s-pause:latest, \
so a QEMU node needs no registry."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"

# Set before "inherit image", which picks the image-container class from it.
IMAGE_FSTYPES = "container"

inherit image

# The node image builds the machine's kernel anyway; linux-dummy would be a second provider.
# nooelint: oelint.vars.mispell.unknown - oe-core image-container.bbclass variable, missing from oelint's kirkstone data
IMAGE_CONTAINER_NO_DUMMY = "1"
IMAGE_FEATURES = ""
IMAGE_LINGUAS = ""
NO_RECOMMENDATIONS = "1"
IMAGE_INSTALL = "busybox"
