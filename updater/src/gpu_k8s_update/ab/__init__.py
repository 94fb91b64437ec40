"""A/B backends: how an image installs an OS update into its other slot, says whether one is
pending, commits it and rolls it back. One small interface (interface.ABBackend), one class per
Mender integration the images use: GRUB (x86-64), U-Boot (Jetson Nano) and meta-mender-tegra's
native scheme (Jetson Orin and Thor). The image names its backend (image-info, written by the
gpu-k8s-update recipe from the Mender integration it was built with); select.py builds it."""

from gpu_k8s_update.ab.interface import ABBackend, ImageInfo, parse_image_info, read_image_info
from gpu_k8s_update.ab.select import BACKEND_NAMES, backend_for

__all__ = ["ABBackend", "BACKEND_NAMES", "ImageInfo", "backend_for", "parse_image_info", "read_image_info"]
