SUMMARY = "Debug gpu-k8s-image: root logs in over ssh with an empty password"
DESCRIPTION = "For the QEMU smoke test and lab boards only, never for a fleet: the same \
content as gpu-k8s-image, but root has an empty password and sshd accepts it."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"

require gpu-k8s-image.inc

# nooelint: oelint.var.badimagefeature.allow-empty-password,oelint.var.badimagefeature.allow-root-login,oelint.var.badimagefeature.empty-root-password - debug image by design: the smoke test logs in as root over ssh
IMAGE_FEATURES += "empty-root-password allow-empty-password allow-root-login"
