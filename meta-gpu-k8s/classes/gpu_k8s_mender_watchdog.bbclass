# Inherited by our linux-yocto bbappend only with the A/B class (DISTRO_FEATURES has
# "gpu-k8s-mender"): the hardware watchdog turns a hung boot into a reset, and the boot
# counter then returns to the old slot.
SRC_URI:append:x86-64 = " file://gpu-k8s-watchdog-x86.cfg"
