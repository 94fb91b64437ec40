"""Jetson (Tegra) discovery from the device tree, soc0, tegra_fuse and the L4T release file.

A board counts as Jetson only on a SoC signal (device-tree compatible `nvidia,tegra*`, soc0
family `Tegra*`, soc0 soc_id, or the tegra_fuse chip id); `/etc/nv_tegra_release` alone is
L4T userspace, which a container or a copied rootfs can carry on any machine.

Nano (T210, L4T R32) drives its GPU through /dev/nvhost-*; Orin (T234, L4T R36 and R39)
through /dev/nvgpu/igpu0/* with /dev/nvmap and the syncpoint fences of /dev/host1x-fence,
the nodes meta-tegra's devices.csv names for the container runtime.

Thor (T264, L4T R39) has no nvgpu: its Blackwell iGPU (GB10B) runs on NVIDIA's open kernel
driver built for Tegra ("OpenRM": nvidia.ko from nvidia-kernel-oot's unified GPU/display
modules, GPU_VARIANT "openrm-l4t" in meta-tegra's tegra-configs). The driver sees the iGPU as
a PCI device (0000:01:00.0, the address the container toolkit keys Thor on), so it has a
dGPU's interface: /dev/nvidia<minor> and /dev/nvidiactl, /proc/driver/nvidia/gpus/<bus>/information
(model, UUID, minor) and /proc/driver/nvidia/version; the SoC display is a second, non-PCI
device of the same driver with a /dev/nvidiaN of its own, which the toolkit hands containers
with the GPU. /dev/nvmap and /dev/host1x-fence stay, as on Orin.
"""

from __future__ import annotations

import glob
import os
import re

from ..model import Gpu
from .base import DiscoveryError, Probe

# tegra_fuse chip ids -> SoC names (values as read from /sys/module/tegra_fuse/parameters/tegra_chip_id)
CHIP_IDS = {0x21: "T210", 0x18: "T186", 0x19: "T194", 0x23: "T234", 0x26: "T264"}
CHIP_NAMES = {
    "T210": "Tegra X1 (T210)",
    "T186": "Tegra X2 (T186)",
    "T194": "Xavier (T194)",
    "T234": "Orin (T234)",
    "T264": "Thor (T264)",
}
# CUDA compute capability of each SoC's integrated GPU (T264: TEGRA_CUDA_ARCHITECTURE "110" in
# meta-tegra's tegra264.inc, i.e. sm_110)
COMPUTE_CAPABILITY = {"T210": "5.3", "T186": "6.2", "T194": "7.2", "T234": "8.7", "T264": "11.0"}

# Device nodes the iGPU is used through: L4T R32's nvhost names, and from R35 on the /dev/nvgpu
# tree with host1x's fence node (CUDA waits on syncpoints through it on Orin).
GPU_NODE_GLOBS = ("/dev/nvhost-*", "/dev/nvmap", "/dev/nvgpu/igpu0/*", "/dev/host1x-fence")
# Without at least one of these the GPU is not usable, whatever else exists.
ESSENTIAL_NODES = ("/dev/nvhost-gpu", "/dev/nvhost-ctrl-gpu", "/dev/nvgpu/igpu0/ctrl")


# The OpenRM path (Thor). meta-tegra's nv-load-display-modules writes the GPU variant it loaded
# ("openrm-l4t" on tegra264, "nvgpu-l4t" on tegra234) to this file at boot.
GPU_DRIVER_FILE = "/run/nvidia-gpu-driver-active"
OPENRM = "openrm-l4t"
OPENRM_CHIPS = ("T264",)  # SoCs whose iGPU only OpenRM drives, for a root without that file
NVIDIA_CONTROL_NODE = "/dev/nvidiactl"
NVIDIA_NODE_PATTERN = "nvidia[0-9]*"  # in /dev
_NVIDIA_MINOR_NODE = r"/dev/nvidia(\d+)"
# nvidia-uvm's nodes appear when nvidia-uvm loads (CUDA's first use); nvidia-modeset's with the
# display stack: Allocate passes them when present, as for a dGPU
OPENRM_OPTIONAL_NODES = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
PROC_GPUS = "/proc/driver/nvidia/gpus"
PROC_DRIVER_VERSION = "/proc/driver/nvidia/version"
THOR_IGPU_BUS = "0000:01:00.0"
_KERNEL_MODULE_VERSION = r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)"

RELEASE_FILES = ("/etc/nv_tegra_release", "/usr/share/nv_tegra/nv_tegra_release")
_RELEASE = r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)"  # compiled on use (re caches)
NVPMODEL_CONF = "/etc/nvpmodel.conf"
NVPMODEL_STATUS = "/var/lib/nvpmodel/status"
_POWER_MODEL = r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)"
_PM_DEFAULT = r"<\s*PM_CONFIG\s+DEFAULT=(\d+)"


def parse_gpu_information(text: str) -> dict[str, str]:
    """The NVIDIA driver's /proc/driver/nvidia/gpus/<bus>/information as {field: value}: "Model",
    "GPU UUID", "Bus Location", "Device Minor", ... (one "Name: <tabs> value" per line)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def driver_version(text: str) -> str:
    """'595.78' from /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX Open Kernel Module for
    aarch64  595.78  Release Build ..."), or ''."""
    match = re.search(_KERNEL_MODULE_VERSION, text)
    return match.group(1) if match else ""


def integrated_gpu(gpus: list[dict[str, str]]) -> dict[str, str] | None:
    """Thor's iGPU among the driver's PCI GPUs: the one at 0000:01:00.0 (where the container
    toolkit looks for it too), else the one the driver names Thor; None when neither is listed."""
    for gpu in gpus:
        if gpu.get("Bus Location", "").lower() == THOR_IGPU_BUS:
            return gpu
    named = [gpu for gpu in gpus if "Thor" in gpu.get("Model", "")]
    return named[0] if len(named) == 1 else None


def _minor(gpu: dict[str, str] | None) -> int | None:
    value = (gpu or {}).get("Device Minor", "")
    return int(value) if value.isdigit() else None


class TegraBackend:
    name = "tegra"

    def __init__(self, root: str = "/") -> None:
        self.root = root

    # -- reading the OS under root

    def _path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _read(self, path: str) -> str | None:
        try:
            with open(self._path(path), "rb") as f:
                return f.read(4096).decode("utf-8", "replace")
        except OSError:
            return None

    def _dt(self, name: str) -> str | None:
        # /proc/device-tree is a link to /sys/firmware/devicetree/base; fixtures may have either
        for base in ("/proc/device-tree", "/sys/firmware/devicetree/base"):
            value = self._read(f"{base}/{name}")
            if value is not None:
                return value
        return None

    # -- facts

    def compatible(self) -> list[str]:
        raw = self._dt("compatible") or ""
        return [c for c in raw.split("\0") if c]

    def model(self) -> str:
        return (self._dt("model") or "").strip("\0\n ")

    def chip(self) -> tuple[str, list[str]]:
        """(SoC name or "", evidence lines)."""
        evidence: list[str] = []
        chip = ""
        raw_id = self._read("/sys/module/tegra_fuse/parameters/tegra_chip_id")
        if raw_id is not None:
            text = raw_id.strip()
            try:
                value = int(text, 0)
            except ValueError:
                value = -1
            chip = CHIP_IDS.get(value, "")
            evidence.append(f"tegra_fuse chip id {text}" + (f" = {chip}" if chip else " (unknown chip)"))
        family = (self._read("/sys/devices/soc0/family") or "").strip()
        if family.lower().startswith("tegra"):
            evidence.append(f"soc0 family {family}")
            match = re.search(r"tegra(\d{3})", family.lower())
            if not chip and match:
                chip = f"T{match.group(1)}"
            # newer kernels (R36's 5.15, R39's 6.8) say family "Tegra" and give the chip id as soc_id
            soc_id = (self._read("/sys/devices/soc0/soc_id") or "").strip()
            if soc_id.isdigit() and int(soc_id) in CHIP_IDS:
                evidence.append(f"soc0 soc_id {soc_id} = {CHIP_IDS[int(soc_id)]}")
                chip = chip or CHIP_IDS[int(soc_id)]
        for entry in self.compatible():
            match = re.fullmatch(r"nvidia,tegra(\d{3})", entry)
            if match:
                evidence.append(f"device tree compatible {entry}")
                chip = chip or f"T{match.group(1)}"
                break
        return chip, evidence

    def l4t_release(self) -> str:
        """'R32.7.6' from '# R32 (release), REVISION: 7.6, ...' (R36: 'REVISION: 4.0', R39: '2.0'), or ''.

        meta-tegra keeps the first line in /etc and a copy in /usr/share/nv_tegra."""
        for path in RELEASE_FILES:
            match = re.search(_RELEASE, self._read(path) or "")
            if match:
                return f"R{match.group(1)}.{match.group(2).rstrip('.')}"
        return ""

    def power_mode(self) -> str:
        """The nvpmodel power mode's name (e.g. '15W', 'MAXN_SUPER'), or '' when nvpmodel is absent.

        /var/lib/nvpmodel/status holds the mode set now ('pmode:0002 ...'); without it the
        configuration's default (`< PM_CONFIG DEFAULT=2 >`) is what boot applies."""
        conf = self._read_all(NVPMODEL_CONF) or ""
        names = {int(m.group(1)): m.group(2) for m in re.finditer(_POWER_MODEL, conf)}
        status = self._read(NVPMODEL_STATUS) or ""
        current = re.search(r"pmode:\s*(\d+)", status) or re.fullmatch(r"\s*(\d+)\s*", status)
        chosen = current or re.search(_PM_DEFAULT, conf)
        if chosen is None:
            return ""
        number = int(chosen.group(1))
        return names.get(number, f"mode {number}")

    def _read_all(self, path: str) -> str | None:
        try:
            with open(self._path(path), "rb") as f:
                return f.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return None

    def device_nodes(self) -> tuple[str, ...]:
        found: list[str] = []
        for pattern in GPU_NODE_GLOBS:
            for path in sorted(glob.glob(self._path(pattern))):
                found.append("/" + os.path.relpath(path, self.root).lstrip("./"))
        return tuple(dict.fromkeys(found))

    def memory_mib(self) -> int | None:
        meminfo = self._read("/proc/meminfo") or ""
        match = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
        return int(match.group(1)) // 1024 if match else None

    def gpu_driver(self, chip: str) -> str:
        """"openrm-l4t" when the iGPU runs on NVIDIA's open driver (Thor), else "" (nvgpu, nvhost).

        meta-tegra's own record of what it loaded wins; a root without it (a container, an image
        not booted yet) is judged by the chip."""
        active = (self._read(GPU_DRIVER_FILE) or "").strip()
        if active:
            return OPENRM if active == OPENRM else ""
        return OPENRM if chip in OPENRM_CHIPS else ""

    def openrm_gpus(self) -> list[dict[str, str]]:
        """The PCI GPUs the NVIDIA driver has (its /proc/driver/nvidia/gpus), as parse_gpu_information's fields."""
        found = []
        for path in sorted(glob.glob(glob.escape(self._path(PROC_GPUS)) + "/*/information")):
            text = self._read(os.path.relpath(path, self.root))
            if text is None:
                continue
            fields = parse_gpu_information(text)
            fields.setdefault("Bus Location", os.path.basename(os.path.dirname(path)))
            found.append(fields)
        return found

    def _exists(self, path: str) -> bool:
        return os.path.exists(self._path(path))

    def openrm_device_nodes(self, minor: int | None, other_minors: set[int]) -> tuple[str, ...]:
        """Thor's nodes: the GPU's /dev/nvidia<minor> first, /dev/nvidiactl, the driver's other numbered
        nodes that are no other PCI GPU's (the SoC display), then /dev/nvmap and /dev/host1x-fence.

        Without the driver's /proc (minor None) the GPU is taken to be minor 0: the PCI iGPU probes
        before the platform display device, which is the order the toolkit's Thor tests assume."""
        own = f"/dev/nvidia{minor if minor is not None else 0}"
        numbered = []
        for path in glob.glob(os.path.join(glob.escape(self._path("/dev")), NVIDIA_NODE_PATTERN)):
            node = "/" + os.path.relpath(path, self.root).lstrip("./")
            match = re.fullmatch(_NVIDIA_MINOR_NODE, node)
            if match and int(match.group(1)) not in other_minors:
                numbered.append((int(match.group(1)), node))
        first = [node for node in (own, NVIDIA_CONTROL_NODE) if self._exists(node)]
        return tuple(dict.fromkeys([*first, *(node for _, node in sorted(numbered)), *self.device_nodes()]))

    def _openrm(self, reason: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """(device nodes, properties) of Thor's iGPU; DiscoveryError naming what is missing."""
        gpus = self.openrm_gpus()
        igpu = integrated_gpu(gpus)
        if gpus and igpu is None:
            buses = ", ".join(g.get("Bus Location", "?") for g in gpus)
            raise DiscoveryError(
                f"tegra: {reason} but the NVIDIA driver lists only {buses}, not the integrated GPU at "
                f"{THOR_IGPU_BUS}: see `dmesg | grep NVRM` for why it did not take the iGPU"
            )
        minor = _minor(igpu)
        others = {m for m in (_minor(g) for g in gpus if g is not igpu) if m is not None}
        nodes = self.openrm_device_nodes(minor, others)
        own = f"/dev/nvidia{minor if minor is not None else 0}"
        missing = [node for node in (own, NVIDIA_CONTROL_NODE) if node not in nodes]
        if missing:
            raise DiscoveryError(
                f"tegra: {reason} but its GPU device node(s) {', '.join(missing)} do not exist: Thor's GPU "
                "runs on the nvidia module (OpenRM), which meta-tegra loads at boot with nvidia_drm; check "
                "`lsmod | grep nvidia` and `systemctl status systemd-modules-load`, or, in a container, mount /dev"
            )
        properties = {"gpu_driver": OPENRM,
                      "driver_version": driver_version(self._read(PROC_DRIVER_VERSION) or ""),
                      "uuid": (igpu or {}).get("GPU UUID", ""),
                      "pci_bus_id": (igpu or {}).get("Bus Location", "").lower()}
        return nodes, properties

    # -- the Backend contract

    def probe(self) -> Probe:
        chip, evidence = self.chip()
        release = self.l4t_release()
        if release:
            evidence.append(f"/etc/nv_tegra_release {release}")
        if len(evidence) == (1 if release else 0):
            if release:
                return Probe(False, f"L4T release file says {release} but no Tegra SoC is visible "
                             "(no nvidia,tegra device tree, soc0 family or tegra_fuse chip id)", tuple(evidence))
            return Probe(False, "no Tegra SoC: no nvidia,tegra device tree, soc0 family or tegra_fuse chip id",
                         tuple(evidence))
        what = self.model() or "Jetson"
        if self.gpu_driver(chip) == OPENRM:
            active = (self._read(GPU_DRIVER_FILE) or "").strip()
            evidence.append(f"{GPU_DRIVER_FILE} {active}" if active else f"{chip}: its iGPU runs on OpenRM")
            return Probe(True, f"{what} ({chip}, its iGPU on NVIDIA's OpenRM driver)", tuple(evidence))
        return Probe(True, f"{what} ({chip or 'unknown Tegra SoC'})", tuple(evidence))

    def discover(self) -> list[Gpu]:
        probe = self.probe()
        if not probe.usable:
            raise DiscoveryError(f"tegra: {probe.reason}")
        chip, _ = self.chip()
        properties = {"chip": chip or "unknown", "model": self.model(), "l4t": self.l4t_release(),
                      "compatible": ",".join(self.compatible()), "memory": "shared with the CPU",
                      "power_mode": self.power_mode()}
        if chip in COMPUTE_CAPABILITY:
            properties["compute_capability"] = COMPUTE_CAPABILITY[chip]
        optional: tuple[str, ...] = ()
        if self.gpu_driver(chip) == OPENRM:
            nodes, openrm = self._openrm(probe.reason)
            properties.update(openrm)
            optional = OPENRM_OPTIONAL_NODES
        else:
            nodes = self.device_nodes()
            if not any(n in nodes for n in ESSENTIAL_NODES):
                raise DiscoveryError(
                    f"tegra: {probe.reason} but no GPU device node ({', '.join(ESSENTIAL_NODES)}) exists: "
                    "load the GPU driver (modprobe nvgpu) or, in a container, mount /dev"
                )
        slug = chip.lower() if chip else "unknown"
        return [
            Gpu(
                id=f"tegra-{slug}-igpu0",
                index=0,
                name=CHIP_NAMES.get(chip, "Tegra iGPU"),
                backend="tegra",
                device_nodes=nodes,
                optional_nodes=optional,
                memory_mib=self.memory_mib(),
                properties={k: v for k, v in properties.items() if v},
            )
        ]
