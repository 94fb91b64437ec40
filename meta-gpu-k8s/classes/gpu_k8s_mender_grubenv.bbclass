# Inherited by our grub-mender-grubenv bbappend only with the A/B class. Mender's GRUB script
# boots the slots, not the wic loader entry that the image's APPEND reaches: give it the same
# kernel arguments on x86-64. The grubenv Makefile concatenates every NN_*_grub.cfg of the
# source tree in order; 07 runs before 10_bootargs_grub.cfg, which keeps what bootargs holds.
SRC_URI:append:x86-64 = " file://07_gpu_k8s_bootargs_grub.cfg;subdir=git"
