"""Check (Thor): NVIDIA's open kernel driver (OpenRM) that runs Thor's iGPU: loaded, of the same version
as L4T's userspace and GPU firmware, and with the CUDA memory node containers need.

On meta-tegra wrynose (L4T R39.2) all three come from one L4T release: nvidia.ko from
nvidia-kernel-oot, libnvidia-rmapi-tegra.so.595.78 from tegra-libraries-core and
/lib/firmware/nvidia/595.78 from tegra-firmware (its tegra264 package). A module and libraries
of two releases (a half-applied update) is the Thor form of "driver/library version mismatch".
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from ..config.settings import Settings
from ..discovery.tegra import PROC_DRIVER_VERSION, driver_version
from .host import host_path, read_text, short_list
from .report import FAIL, PASS, WARN, Check

RMAPI_LIBRARY = "/usr/lib/libnvidia-rmapi-tegra.so."  # + version; the userspace half of the RM API
FIRMWARE_DIR = "/lib/firmware/nvidia"  # /<version>: where the driver loads its GPU firmware from
UVM_NODE = "/dev/nvidia-uvm"


def evaluate_openrm_driver(version_file: str | None, libraries: Sequence[str], firmware: bool,
                           uvm_node: bool) -> Check:
    """`version_file`: /proc/driver/nvidia/version's text (None: the module is not loaded); `libraries`: the
    versions of libnvidia-rmapi-tegra.so.<v> in /usr/lib; `firmware`: /lib/firmware/nvidia/<kernel's
    version> exists; `uvm_node`: /dev/nvidia-uvm exists."""
    name = "NVIDIA driver"
    if version_file is None:
        return Check(name, FAIL, f"{PROC_DRIVER_VERSION} does not exist: the nvidia module (OpenRM), which drives "
                     "Thor's GPU, is not loaded",
                     "meta-tegra loads it at boot with nvidia_drm (nv-load-display-modules, after "
                     "systemd-modules-load): see `systemctl status systemd-modules-load` and `dmesg | grep NVRM`")
    kernel = driver_version(version_file)
    if not kernel:
        return Check(name, WARN, f"{PROC_DRIVER_VERSION} names no version the check understands",
                     f"compare `cat {PROC_DRIVER_VERSION}` with `ls {RMAPI_LIBRARY}*` by hand")
    if not libraries:
        return Check(name, FAIL, f"kernel module {kernel} loaded but no {RMAPI_LIBRARY}<version>: CUDA has no "
                     "way to talk to the driver", "install L4T's core libraries (tegra-libraries-core)")
    if kernel not in libraries:
        return Check(name, FAIL, f"kernel module {kernel} but libnvidia-rmapi-tegra {short_list(list(libraries))}: "
                     "CUDA fails with a driver/library version mismatch",
                     "the module and L4T's libraries come from one L4T release: reboot after an update, or "
                     "build the image from one meta-tegra pin")
    if not firmware:
        return Check(name, WARN, f"kernel module and libnvidia-rmapi-tegra are both {kernel} but "
                     f"{FIRMWARE_DIR}/{kernel} does not exist: the driver loads the GPU's firmware from there",
                     "install the tegra264 firmware of the same L4T release (tegra-firmware-tegra264)")
    found = f"kernel module, libnvidia-rmapi-tegra and {FIRMWARE_DIR}/{kernel} are all {kernel} (OpenRM)"
    if not uvm_node:
        return Check(name, WARN, f"{found}, but {UVM_NODE} does not exist: a container started now gets no "
                     "nvidia-uvm node and CUDA in it cannot initialise",
                     f"load nvidia-uvm and make its node (nvidia-modprobe -u -c 0, or run a CUDA program on the "
                     f"host once), then check `ls -l {UVM_NODE}`")
    return Check(name, PASS, found)


def rmapi_versions(settings: Settings) -> list[str]:
    prefix = host_path(settings, RMAPI_LIBRARY)
    return sorted({path[len(prefix):] for path in glob.glob(glob.escape(prefix) + "*")})


def check_openrm_driver(settings: Settings) -> Check:
    version_file = read_text(host_path(settings, PROC_DRIVER_VERSION))
    kernel = driver_version(version_file or "")
    firmware = bool(kernel) and os.path.isdir(host_path(settings, f"{FIRMWARE_DIR}/{kernel}"))
    return evaluate_openrm_driver(version_file, rmapi_versions(settings), firmware,
                                  os.path.exists(host_path(settings, UVM_NODE)))
