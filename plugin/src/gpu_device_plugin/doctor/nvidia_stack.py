"""Checks for a discrete GPU's stack: the driver (loaded, kernel and userspace of one version) and the
NVIDIA Container Toolkit's CDI spec (present, naming every GPU, made after the driver loaded)."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence

from .. import toolkit_cdi
from ..model import Gpu
from ..settings import Settings
from .host import host_path, read_text, short_list
from .report import FAIL, PASS, SKIP, WARN, Check

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
MODULE_DIR = "/sys/module/nvidia"  # made when the module loads: its time is the driver's load time
RUNTIME_CONFIG = "/etc/nvidia-container-runtime/config.toml"
# where libnvidia-ml.so.<version> lives: Yocto's libdir, multiarch (Debian) and lib64 (RPM) layouts
LIBRARY_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
_KERNEL_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
_MODE = re.compile(r"""^\s*mode\s*=\s*["']([^"']+)["']""", re.MULTILINE)


def kernel_driver_version(text: str | None) -> str:
    """'580.105.08' from /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX Open Kernel Module for
    x86_64  580.105.08  Release Build ..."), or ""."""
    match = _KERNEL_VERSION.search(text or "")
    return match.group(1) if match else ""


def nvml_library_versions(settings: Settings) -> list[str]:
    versions = []
    for directory in LIBRARY_DIRS:
        for path in glob.glob(host_path(settings, f"{directory}/libnvidia-ml.so.*.*")):
            versions.append(os.path.basename(path).removeprefix("libnvidia-ml.so."))
    return sorted(set(versions))


def evaluate_driver(gpu_kind: str | None, kernel: str, libraries: Sequence[str], loaded: bool) -> Check:
    name = "NVIDIA driver"
    if gpu_kind != "nvml":
        return Check(name, SKIP, "no discrete GPU discovered: the x86 NVIDIA driver is not needed here")
    if not loaded:
        return Check(name, FAIL, f"{DRIVER_VERSION_FILE} does not exist: the nvidia kernel module is not loaded",
                     "modprobe nvidia (and see dmesg: a module built for another kernel, or nouveau holding the GPU)")
    if not kernel:
        return Check(name, WARN, f"{DRIVER_VERSION_FILE} names no version the check understands",
                     "compare `cat /proc/driver/nvidia/version` with `nvidia-smi` by hand")
    if not libraries:
        return Check(name, WARN, f"kernel module {kernel} loaded but no libnvidia-ml.so.<version> in "
                     f"{', '.join(LIBRARY_DIRS)}", "install the driver's userspace of the same version")
    if kernel not in libraries:
        return Check(name, FAIL, f"kernel module {kernel} but libnvidia-ml {short_list(list(libraries))}: NVML "
                     "fails with \"Driver/library version mismatch\" and no GPU is found",
                     "reboot after a driver upgrade, or install the kernel module and userspace of one version")
    return Check(name, PASS, f"kernel module and libnvidia-ml are both {kernel}")


def evaluate_cdi(gpu_kind: str | None, gpus: Sequence[Gpu], specs: Sequence[toolkit_cdi.ToolkitSpec],
                 settings: Settings, driver_loaded_at: float | None, runtime_mode: str) -> Check:
    """The toolkit's spec: present, naming every GPU, made after the driver loaded."""
    name = "NVIDIA CDI spec"
    relevant = [g for g in gpus if g.backend == gpu_kind]
    if gpu_kind not in ("nvml", "tegra") or not relevant:
        return Check(name, SKIP, "no NVIDIA GPU discovered")
    uses_cdi = any(s.startswith("cdi-") for s in settings.device_list_strategy) or runtime_mode == "cdi"
    mode = f"the nvidia runtime's mode is {runtime_mode}" if runtime_mode else f"no {RUNTIME_CONFIG}"
    if not specs:
        if gpu_kind == "tegra":
            return Check(name, SKIP if not uses_cdi else WARN,
                         f"no toolkit spec in {' or '.join(toolkit_cdi.SPEC_DIRS)}: containers get the GPU from the "
                         "CSV files (nvidia runtime) or the plugin's own spec", "" if not uses_cdi else
                         "for the toolkit's CDI names on Orin run: nvidia-ctk cdi generate --mode=csv "
                         "--output=/var/run/cdi/nvidia.yaml")
        return Check(name, FAIL if uses_cdi else WARN,
                     f"no spec of kind {toolkit_cdi.TOOLKIT_KIND} in {' or '.join(toolkit_cdi.SPEC_DIRS)} ({mode}): "
                     + ("containers asking for CDI devices fail" if uses_cdi else
                        "GPU containers depend on the nvidia runtime's legacy mode"),
                     f"run {toolkit_cdi.REGENERATE} after the driver loads (the image's CDI unit does this at boot)")
    found = toolkit_cdi.coverage(relevant, specs, settings.device_id_strategy)
    paths = short_list(list(dict.fromkeys(s.path.removeprefix(settings.host_root.rstrip("/")) for s in specs)))
    if found.problems:
        lines = [f"GPU {g.index}: {found.problems[g.id]}" for g in relevant if g.id in found.problems]
        return Check(name, FAIL, f"{paths}: " + "; ".join(lines), f"regenerate it: {toolkit_cdi.REGENERATE}")
    newest = max(s.mtime for s in specs)
    if gpu_kind == "nvml" and driver_loaded_at is not None and newest < driver_loaded_at:
        return Check(name, WARN, f"{paths} is older than the loaded driver: made for an earlier boot or driver",
                     f"regenerate it: {toolkit_cdi.REGENERATE}")
    names = ", ".join(found.names[g.id] for g in relevant)
    return Check(name, PASS, f"{paths} names every GPU ({names}); {mode}")


def runtime_mode(text: str | None) -> str:
    match = _MODE.search(text or "")
    return match.group(1) if match else ""


def check_driver(settings: Settings, gpu_kind: str | None) -> Check:
    text = read_text(host_path(settings, DRIVER_VERSION_FILE))
    return evaluate_driver(gpu_kind, kernel_driver_version(text), nvml_library_versions(settings), text is not None)


def check_cdi(settings: Settings, gpu_kind: str | None, gpus: Sequence[Gpu]) -> Check:
    try:
        loaded_at: float | None = os.stat(host_path(settings, MODULE_DIR)).st_mtime
    except OSError:
        loaded_at = None
    specs = toolkit_cdi.read_specs(settings.host_root, skip=(toolkit_cdi.own_spec(settings),), warn=lambda _: None)
    mode = runtime_mode(read_text(host_path(settings, RUNTIME_CONFIG)))
    return evaluate_cdi(gpu_kind, gpus, specs, settings, loaded_at, mode)
