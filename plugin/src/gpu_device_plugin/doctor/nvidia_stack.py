"""Checks for NVIDIA's stack: a discrete GPU's driver (loaded, kernel and userspace of one version), the
NVIDIA Container Toolkit's CDI spec (present, naming every GPU, made after the driver loaded), the
data-centre services (Fabric Manager where an NVSwitch is, the persistence daemon, MIG nodes) and,
on Orin, the toolkit's configuration (mode, CSV alternate roots)."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence

from ..cdi import toolkit_spec
from ..config.settings import Settings
from ..health.fabric import FABRICMANAGER_COMM, NVSWITCH_DEVICES
from ..model import Gpu
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


def evaluate_cdi(gpu_kind: str | None, gpus: Sequence[Gpu], specs: Sequence[toolkit_spec.ToolkitSpec],
                 settings: Settings, driver_loaded_at: float | None, runtime_mode: str) -> Check:
    """The toolkit's spec: present, naming every GPU, made after the driver loaded."""
    name = "NVIDIA CDI spec"
    relevant = [g for g in gpus if g.backend == gpu_kind and not g.mig_enabled]
    if gpu_kind not in ("nvml", "tegra") or not relevant:
        return Check(name, SKIP, "no NVIDIA GPU discovered")
    uses_cdi = any(s.startswith("cdi-") for s in settings.device_list_strategy) or runtime_mode == "cdi"
    mode = f"the nvidia runtime's mode is {runtime_mode}" if runtime_mode else f"no {RUNTIME_CONFIG}"
    if not specs:
        if gpu_kind == "tegra":
            return Check(name, SKIP if not uses_cdi else WARN,
                         f"no toolkit spec in {' or '.join(toolkit_spec.SPEC_DIRS)}: containers get the GPU from the "
                         "CSV files (nvidia runtime) or the plugin's own spec", "" if not uses_cdi else
                         "for the toolkit's CDI names on Orin run: nvidia-ctk cdi generate --mode=csv "
                         "--output=/var/run/cdi/nvidia.yaml")
        return Check(name, FAIL if uses_cdi else WARN,
                     f"no spec of kind {toolkit_spec.TOOLKIT_KIND} in {' or '.join(toolkit_spec.SPEC_DIRS)} ({mode}): "
                     + ("containers asking for CDI devices fail" if uses_cdi else
                        "GPU containers depend on the nvidia runtime's legacy mode"),
                     f"run {toolkit_spec.REGENERATE} after the driver loads (the image's CDI unit does this at boot)")
    found = toolkit_spec.coverage(relevant, specs, settings.device_id_strategy)
    paths = short_list(list(dict.fromkeys(s.path.removeprefix(settings.host_root.rstrip("/")) for s in specs)))
    if found.problems:
        lines = [f"GPU {g.index}: {found.problems[g.id]}" for g in relevant if g.id in found.problems]
        return Check(name, FAIL, f"{paths}: " + "; ".join(lines), f"regenerate it: {toolkit_spec.REGENERATE}")
    newest = max(s.mtime for s in specs)
    if gpu_kind == "nvml" and driver_loaded_at is not None and newest < driver_loaded_at:
        return Check(name, WARN, f"{paths} is older than the loaded driver: made for an earlier boot or driver",
                     f"regenerate it: {toolkit_spec.REGENERATE}")
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
    specs = toolkit_spec.read_specs(settings.host_root, skip=(toolkit_spec.own_spec(settings),), warn=lambda _: None)
    mode = runtime_mode(read_text(host_path(settings, RUNTIME_CONFIG)))
    return evaluate_cdi(gpu_kind, gpus, specs, settings, loaded_at, mode)


def evaluate_jetson_toolkit(gpu_kind: str | None, l4t: str, config: str | None, dangling: bool,
                            missing_roots: Sequence[str], has_spec: bool, chip: str = "") -> Check:
    """Orin's NVIDIA Container Toolkit (1.19 on meta-tegra wrynose): its config, mode and CSV alternate roots.

    `config`: config.toml's text (None when absent); `dangling`: it is a link whose target is gone
    (meta-tegra links it to /run, written at boot by nvidia-container-setup.service). An Orin
    (T234, nvgpu) must run in mode csv: "auto" picks csv only while NVML is absent or names an
    "(nvgpu)" GPU (toolkit internal/info/auto.go), and meta-tegra installs NVML."""
    name = "NVIDIA container toolkit"
    if gpu_kind != "tegra":
        return Check(name, SKIP, "only a Jetson's toolkit is checked here (x86: see the driver and CDI checks)")
    if l4t.startswith("R32"):
        return Check(name, SKIP, f"L4T {l4t}: the Nano's runtime (1.0.x) reads only the CSV files")
    setup = "systemctl status nvidia-container-setup.service (it writes the config at boot), then restart docker"
    if dangling:
        return Check(name, FAIL, f"{RUNTIME_CONFIG} links to a file that does not exist: the runtime runs with "
                     "defaults, without meta-tegra's passthrough libraries", setup)
    if config is None:
        return Check(name, FAIL, f"no {RUNTIME_CONFIG}: the runtime runs with defaults, without the CSV alternate "
                     "roots meta-tegra configures", setup)
    mode = runtime_mode(config) or "auto"
    if mode == "cdi" and not has_spec:
        return Check(name, FAIL, "mode is cdi but no toolkit CDI spec exists: every GPU container fails",
                     "set mode = \"auto\" (CSV mode on Jetson) or run nvidia-ctk cdi generate --mode=csv "
                     "--output=/var/run/cdi/nvidia.yaml")
    if mode not in ("auto", "csv", "cdi"):
        return Check(name, WARN, f"mode is {mode}: on a Jetson the toolkit injects the GPU in csv mode (auto picks it)",
                     f'set mode = "auto" in {RUNTIME_CONFIG}')
    if chip == "T234" and mode == "auto":
        return Check(name, WARN, "mode is auto: the runtime takes csv mode only while NVML is absent or names an "
                     "(nvgpu) GPU; if NVML answers otherwise GPU pods fail to start",
                     "pin mode = \"csv\" after the setup unit (the image's gpu-k8s-nvidia-runtime-config drop-in "
                     "does), then restart docker")
    if missing_roots:
        return Check(name, WARN, f"CSV alternate root(s) {short_list(list(missing_roots))} do not exist: their "
                     "libraries are taken from the rootfs instead", "install tegra-container-passthrough")
    return Check(name, PASS, f"{RUNTIME_CONFIG}: mode {mode}" + (", CDI spec present" if has_spec else ""))


def check_jetson_toolkit(settings: Settings, gpu_kind: str | None, gpus: Sequence[Gpu]) -> Check:
    from ..cdi.spec import read_alt_roots

    path = host_path(settings, RUNTIME_CONFIG)
    dangling = os.path.islink(path) and not os.path.exists(path)
    l4t = next((g.properties.get("l4t", "") for g in gpus if g.backend == "tegra"), "")
    roots = read_alt_roots(settings.host_root)
    missing = [r for r in roots if not os.path.isdir(host_path(settings, r))]
    has_spec = bool(toolkit_spec.read_specs(settings.host_root, skip=(toolkit_spec.own_spec(settings),),
                                           warn=lambda _: None))
    chip = next((g.properties.get("chip", "") for g in gpus if g.backend == "tegra"), "")
    return evaluate_jetson_toolkit(gpu_kind, l4t, read_text(path), dangling, missing, has_spec, chip)


# ---------------------------------------------------------------- data-centre GPUs

MIG_CAPS = "/dev/nvidia-caps"
# /proc/<pid>/comm holds at most 15 characters
PERSISTENCED_COMM = "nvidia-persiste"


def running_programs(settings: Settings) -> set[str]:
    """The `comm` of every process under the host root's /proc."""
    names = set()
    for path in glob.glob(host_path(settings, "/proc/[0-9]*/comm")):
        text = read_text(path)
        if text:
            names.add(text.strip())
    return names


def evaluate_datacentre(gpu_kind: str | None, gpus: Sequence[Gpu], nvswitches: Sequence[str],
                        programs: set[str], has_cfg_library: bool, has_mig_caps: bool) -> Check:
    """Fabric Manager where an NVSwitch is, the persistence daemon, MIG capability nodes."""
    name = "NVIDIA data-centre services"
    if gpu_kind != "nvml":
        return Check(name, SKIP, "no discrete GPU discovered")
    if nvswitches and FABRICMANAGER_COMM not in programs:
        return Check(name, FAIL, f"{len(nvswitches)} NVSwitch(es) ({short_list(list(nvswitches))}) but Fabric Manager "
                     "is not running: CUDA fails with \"system not yet initialized\" (802) on every GPU",
                     "systemctl status nvidia-fabricmanager; an image without it needs Fabric Manager of the "
                     "driver's version pinned (docs/layer.md, \"Data-centre GPUs\")")
    if PERSISTENCED_COMM not in programs:
        why = ("" if has_cfg_library else f"; libnvidia-cfg.so.1, which it loads at start, is not in "
               f"{', '.join(LIBRARY_DIRS)}")
        return Check(name, WARN, "nvidia-persistenced is not running: a GPU with no client is set up again (GSP boot) "
                     f"for every CUDA container{why}", "systemctl status nvidia-persistenced")
    if any(g.mig_enabled for g in gpus if g.backend == "nvml") and not has_mig_caps:
        return Check(name, WARN, f"a GPU has MIG enabled but {MIG_CAPS} does not exist: MIG devices' containers "
                     "lack their capability nodes",
                     "nvidia-modprobe -f /proc/driver/nvidia/capabilities/mig/config (the CDI unit does this at boot)")
    fabric = f"Fabric Manager running for {len(nvswitches)} NVSwitch(es)" if nvswitches else "no NVSwitch"
    return Check(name, PASS, f"nvidia-persistenced running; {fabric}")


def check_datacentre(settings: Settings, gpu_kind: str | None, gpus: Sequence[Gpu]) -> Check:
    nvswitches = sorted(os.path.basename(p) for p in glob.glob(host_path(settings, NVSWITCH_DEVICES + "/*")))
    has_cfg = any(glob.glob(host_path(settings, f"{d}/libnvidia-cfg.so.1")) for d in LIBRARY_DIRS)
    return evaluate_datacentre(gpu_kind, gpus, nvswitches, running_programs(settings) if gpu_kind == "nvml" else set(),
                               has_cfg, os.path.isdir(host_path(settings, MIG_CAPS)))
