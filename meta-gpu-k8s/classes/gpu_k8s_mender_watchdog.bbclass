# Inherited by our kernel bbappends only with the A/B class (DISTRO_FEATURES has
# "gpu-k8s-mender"): the hardware watchdog turns a hung boot into a reset, and the boot counter
# (x86-64: GRUB's; Orin and Thor: UEFI's rootfs retry count) then returns to the old slot.
#   linux-yocto (x86-64, QEMU)                 recipes-kernel/watchdog/linux-yocto_%.bbappend
#   linux-noble-nvidia-tegra (Orin, Thor)      dynamic-layers/mender-tegra/recipes-kernel/watchdog/ (and its fragment)
SRC_URI:append:x86-64 = " file://gpu-k8s-watchdog-x86.cfg"
SRC_URI:append:tegra234 = " file://gpu-k8s-watchdog-tegra.cfg"
SRC_URI:append:tegra264 = " file://gpu-k8s-watchdog-tegra.cfg"
