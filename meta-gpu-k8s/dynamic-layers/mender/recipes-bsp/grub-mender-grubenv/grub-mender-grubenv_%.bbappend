# With the A/B class (classes/gpu_k8s_mender.bbclass) Mender's GRUB script boots the kernel,
# not the wic loader entry that the image's APPEND reaches: give it the same arguments.
# The Makefile concatenates every NN_*_grub.cfg of the source tree in order; 07 runs before
# 10_bootargs_grub.cfg, which keeps what bootargs already holds.
FILESEXTRAPATHS:prepend:gpu-k8s-mender := "${THISDIR}/files:"
SRC_URI:append:gpu-k8s-mender:x86-64 = " file://07_gpu_k8s_bootargs_grub.cfg;subdir=git"
