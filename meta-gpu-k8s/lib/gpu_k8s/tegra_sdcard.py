"""The SD card the SD-card Orin (MACHINE jetson-orin-nano-devkit) is laid out for, stated once:
the layer sets TEGRAFLASH_SDCARD_SIZE from it (classes/gpu_k8s_mender.bbclass) and ./task flash
gives it to meta-tegra's make-sdcard as `dosdcard.sh -s` when it makes an SD image
(tools/flash/orin.py). Written the way make-sdcard reads -s: a number and G, 1000-based.

Why 64 GB: the redundant layout (flash_t234_qspi_sd_rootfs_ab.xml) puts two 14 GiB root slots
(ROOTFSPART_SIZE_DEFAULT, 28 GiB, halved), NVIDIA's 1.56 GB of kernels, recovery, ESPs, UDA and
reserved space, and the layer's data partition (its 1 GiB image at least) on the card: about
32.7 GB, more than a 32 GB card holds (make-sdcard keeps 1 % back: 31.68 GB). 64 GB is also
NVIDIA's own minimum for an SD root. tests/layer/test_orin_layer.py lays the layout out as
make-sdcard does and checks that it fits."""

ORIN_SD_CARD_SIZE = "64G"
