# Only with the A/B update setup (classes/gpu_k8s_mender.bbclass): the hardware watchdog turns
# a hung boot into a reset, and the boot counter then returns to the old slot.
FILESEXTRAPATHS:prepend:gpu-k8s-mender := "${THISDIR}/files:"
SRC_URI:append:gpu-k8s-mender:x86-64 = " file://gpu-k8s-watchdog-x86.cfg"
