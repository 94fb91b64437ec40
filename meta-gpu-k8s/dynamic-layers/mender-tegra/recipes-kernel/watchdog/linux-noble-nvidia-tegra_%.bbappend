# Changes linux-noble-nvidia-tegra (the Orin's and Thor's kernel) only with the A/B class: the hardware
# watchdog systemd arms (classes/gpu_k8s_mender_watchdog.bbclass). The fragment lives beside this
# file. Its directory joins FILESEXTRAPATHS only with the feature too: kernel-yocto checksums
# every fragment found on FILESPATH (do_kernel_metadata).
FILESEXTRAPATHS:prepend := "${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s-mender', '${THISDIR}/files:', '', d)}"
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s-mender', 'gpu_k8s_mender_watchdog', '', d)}
