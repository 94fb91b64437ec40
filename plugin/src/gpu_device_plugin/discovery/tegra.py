"""Jetson (Tegra) discovery from the device tree, soc0, tegra_fuse and the L4T release file.

A board counts as Jetson only on a SoC signal (device-tree compatible `nvidia,tegra*`, soc0
family `Tegra*`, soc0 soc_id, or the tegra_fuse chip id); `/etc/nv_tegra_release` alone is
L4T userspace, which a container or a copied rootfs can carry on any machine.

Nano (T210, L4T R32) drives its GPU through /dev/nvhost-*; Orin (T234, L4T R36 and R39)
through /dev/nvgpu/igpu0/* with /dev/nvmap and the syncpoint fences of /dev/host1x-fence,
the nodes meta-tegra's devices.csv names for the container runtime.
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
# CUDA compute capability of each SoC's integrated GPU
COMPUTE_CAPABILITY = {"T210": "5.3", "T186": "6.2", "T194": "7.2", "T234": "8.7"}

# Device nodes the iGPU is used through: L4T R32's nvhost names, and from R35 on the /dev/nvgpu
# tree with host1x's fence node (CUDA waits on syncpoints through it on Orin).
GPU_NODE_GLOBS = ("/dev/nvhost-*", "/dev/nvmap", "/dev/nvgpu/igpu0/*", "/dev/host1x-fence")
# Without at least one of these the GPU is not usable, whatever else exists.
ESSENTIAL_NODES = ("/dev/nvhost-gpu", "/dev/nvhost-ctrl-gpu", "/dev/nvgpu/igpu0/ctrl")


RELEASE_FILES = ("/etc/nv_tegra_release", "/usr/share/nv_tegra/nv_tegra_release")
_RELEASE = r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)"  # compiled on use (re caches)
NVPMODEL_CONF = "/etc/nvpmodel.conf"
NVPMODEL_STATUS = "/var/lib/nvpmodel/status"
_POWER_MODEL = r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)"
_PM_DEFAULT = r"<\s*PM_CONFIG\s+DEFAULT=(\d+)"


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
        return Probe(True, f"{what} ({chip or 'unknown Tegra SoC'})", tuple(evidence))

    def discover(self) -> list[Gpu]:
        probe = self.probe()
        if not probe.usable:
            raise DiscoveryError(f"tegra: {probe.reason}")
        chip, _ = self.chip()
        nodes = self.device_nodes()
        if not any(n in nodes for n in ESSENTIAL_NODES):
            raise DiscoveryError(
                f"tegra: {probe.reason} but no GPU device node ({', '.join(ESSENTIAL_NODES)}) exists: "
                "load the GPU driver (modprobe nvgpu) or, in a container, mount /dev"
            )
        properties = {"chip": chip or "unknown", "model": self.model(), "l4t": self.l4t_release(),
                      "compatible": ",".join(self.compatible()), "memory": "shared with the CPU",
                      "power_mode": self.power_mode()}
        if chip in COMPUTE_CAPABILITY:
            properties["compute_capability"] = COMPUTE_CAPABILITY[chip]
        slug = chip.lower() if chip else "unknown"
        return [
            Gpu(
                id=f"tegra-{slug}-igpu0",
                index=0,
                name=CHIP_NAMES.get(chip, "Tegra iGPU"),
                backend="tegra",
                device_nodes=nodes,
                memory_mib=self.memory_mib(),
                properties={k: v for k, v in properties.items() if v},
            )
        ]
