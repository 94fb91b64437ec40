"""Jetson telemetry from what L4T exposes: sysfs, procfs and (for the memory clock) debugfs.

DCGM does not run on Jetson, and NVML there answers little, so the values come from the
kernel's own files, the ones tegrastats and jtop read. Per generation:

| field | Nano, L4T R32 (nvgpu, kernel 4.9) | Orin, R36/R39 (nvgpu) | Thor, R38+ (unified driver) |
|---|---|---|---|
| GPU_UTIL | nvgpu `load` (per mille) | nvgpu `load` | NVML utilization (no load file; OpenRM answers NVML) |
| SM_CLOCK | GPU devfreq `cur_freq` (Hz) | GPU devfreq | devfreq `gpu-gpc-0` |
| MEM_CLOCK | debugfs `clk/emc/clk_rate` | debugfs `bpmp/debug/clk/emc/rate` | devfreq `bwmgr` |
| GPU_TEMP | thermal zone `GPU-therm` | zone `gpu-thermal` | zone `gpu-thermal` (unreadable while power-gated) |
| POWER_USAGE | INA3221 rail `POM_5V_GPU` (IIO, mW) | - (rails mix GPU and CPU/SoC) | INA3221 `VDD_GPU` (hwmon) |
| FB_USED/FREE | /proc/meminfo | /proc/meminfo | /proc/meminfo |
| XID_ERRORS | nvgpu errors in the kernel log, from the Tegra health monitor | same | same |

Memory is shared with the CPU: FB_USED is MemTotal - MemAvailable (what the board's CPU and
GPU use together), FB_FREE is MemAvailable (what a new GPU allocation can still get). Only
a rail that feeds the GPU alone counts as its power: the Orin Nano/NX's VDD_CPU_GPU_CV and
the AGX Orin's VDD_GPU_SOC also feed other blocks, so POWER_USAGE is absent there.
Thor's GPU runs on NVIDIA's open driver (OpenRM), not nvgpu: it has no `load` file, and its
driver answers NVML through L4T's libnvidia-ml (meta-tegra's tegra-libraries-nvml, which the
toolkit pulls in), so its utilization is NVML's, read through pynvml when the image has it.
Where each path comes from: tests/plugin/fixtures/telemetry/README.md.
"""

import glob
import logging
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..discovery.base import DiscoveryError
from ..discovery.nvml_lib import load_nvml, nvml_init, nvml_shutdown
from ..model import Gpu
from . import fields
from .collector import GpuLabels, GpuSample, XidSource, no_xids

log = logging.getLogger(__name__)

GPU_RAILS = ("POM_5V_GPU", "VDD_GPU")  # INA3221 channel labels of rails that feed the GPU alone
GPU_THERMAL_ZONES = ("gpu-therm", "gpu-thermal")  # thermal zone types, lowercased
# The memory (EMC) clock in Hz, first readable wins: Thor's bandwidth manager is a devfreq
# device; earlier chips have it only in debugfs (root, debugfs mounted).
MEM_CLOCK_FILES = (
    "/sys/class/devfreq/bwmgr/cur_freq",
    "/sys/kernel/debug/bpmp/debug/clk/emc/rate",  # T186 and later: the BPMP's clock
    "/sys/kernel/debug/clk/emc/clk_rate",  # T210: the common clock framework
)
# nvgpu links its device as gpu.0 beside itself and (kernels after 4.14) one level up
GPU_LINKS = ("/sys/devices/gpu.0", "/sys/devices/platform/gpu.0", "/sys/devices/platform/bus@0/gpu.0")
THOR_GPC_DEVFREQ = "/sys/class/devfreq/gpu-gpc-0"
OPENRM = "openrm-l4t"  # discovery's gpu_driver property of an iGPU on NVIDIA's open driver (Thor)


class Rail(NamedTuple):
    """One INA3221 channel: the IIO driver of L4T R32 gives power, the hwmon driver volts and amps."""

    label: str
    power_mw: str = ""  # IIO in_powerN_input (mW)
    voltage_mv: str = ""  # hwmon inN_input (mV)
    current_ma: str = ""  # hwmon currN_input (mA)


class Sources(NamedTuple):
    """The files a Jetson's values come from, found once (host paths under the root)."""

    load: str | None = None  # per mille
    gpu_clock: str | None = None  # Hz
    mem_clock: str | None = None  # Hz
    temperature: str | None = None  # millidegrees C
    rail: Rail | None = None
    meminfo: str = ""


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(65536).decode("ascii", "replace")
    except OSError:  # missing, unreadable, or a sensor that answers EIO/ENODATA while powered down
        return None


def read_number(path: str | None) -> float | None:
    """The first token of a sysfs value as a number, or None."""
    text = read_text(path) if path else None
    if not text or not text.split():
        return None
    try:
        return float(int(text.split()[0]))
    except ValueError:
        return None


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo's "Name:   1234 kB" lines as {name: kB}."""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0])
    return out


def memory_mib(meminfo: str) -> tuple[int, int] | None:
    """(used, free) in MiB of memory the CPU and GPU share, or None without MemAvailable."""
    values = parse_meminfo(meminfo)
    total, available = values.get("MemTotal"), values.get("MemAvailable")
    if total is None or available is None:
        return None
    return (total - available) // 1024, available // 1024


def rail_watts(rail: Rail) -> float | None:
    if rail.power_mw:
        milliwatts = read_number(rail.power_mw)
        return None if milliwatts is None else round(milliwatts / 1000, 3)
    volts, amps = read_number(rail.voltage_mv), read_number(rail.current_ma)
    if volts is None or amps is None:
        return None
    return round(volts * amps / 1e6, 3)


# ------------------------------------------------------------------ finding the files (once)


def _host(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _first_existing(root: str, paths: Sequence[str]) -> str | None:
    for path in paths:
        if os.path.exists(_host(root, path)):
            return _host(root, path)
    return None


def _gpu_devfreq(root: str) -> tuple[str | None, str | None]:
    """(load file, clock file): nvgpu's devfreq device is the GPU's own, which carries `load`."""
    for entry in sorted(glob.glob(_host(root, "/sys/class/devfreq/*"))):
        load = os.path.join(entry, "device", "load")
        if os.path.isfile(load):
            return load, os.path.join(entry, "cur_freq")
    load = _first_existing(root, [f"{link}/load" for link in GPU_LINKS])
    gpc = _host(root, THOR_GPC_DEVFREQ + "/cur_freq")
    return load, gpc if os.path.isfile(gpc) else None


def _gpu_thermal_zone(root: str) -> str | None:
    for zone in sorted(glob.glob(_host(root, "/sys/class/thermal/thermal_zone*"))):
        kind = (read_text(os.path.join(zone, "type")) or "").strip().lower()
        if kind in GPU_THERMAL_ZONES:
            return os.path.join(zone, "temp")
    return None


def _gpu_rail(root: str) -> Rail | None:
    for chip in sorted(glob.glob(_host(root, "/sys/class/hwmon/hwmon*"))):
        if (read_text(os.path.join(chip, "name")) or "").strip() != "ina3221":
            continue
        for channel in (1, 2, 3):
            label = (read_text(os.path.join(chip, f"in{channel}_label")) or "").strip()
            if label.upper() in GPU_RAILS:
                return Rail(label, voltage_mv=os.path.join(chip, f"in{channel}_input"),
                            current_ma=os.path.join(chip, f"curr{channel}_input"))
    for device in sorted(glob.glob(_host(root, "/sys/bus/i2c/drivers/ina3221x/*/iio:device*"))):
        for channel in (0, 1, 2):
            label = (read_text(os.path.join(device, f"rail_name_{channel}")) or "").strip()
            if label.upper() in GPU_RAILS:
                return Rail(label, power_mw=os.path.join(device, f"in_power{channel}_input"))
    return None


def find_sources(root: str = "/") -> Sources:
    load, clock = _gpu_devfreq(root)
    mem_clock = next((_host(root, p) for p in MEM_CLOCK_FILES if read_number(_host(root, p)) is not None), None)
    return Sources(load=load, gpu_clock=clock, mem_clock=mem_clock, temperature=_gpu_thermal_zone(root),
                   rail=_gpu_rail(root), meminfo=_host(root, "/proc/meminfo"))


# ------------------------------------------------------------------ reading values (each scrape)


def read_values(sources: Sources) -> dict[str, float]:
    values: dict[str, float] = {}
    load = read_number(sources.load)
    if load is not None:
        values[fields.GPU_UTIL] = load / 10
    for name, path in ((fields.SM_CLOCK, sources.gpu_clock), (fields.MEM_CLOCK, sources.mem_clock)):
        hertz = read_number(path)
        if hertz is not None:
            values[name] = round(hertz / 1e6, 3)
    millidegrees = read_number(sources.temperature)
    if millidegrees is not None:
        values[fields.GPU_TEMP] = round(millidegrees / 1000, 3)
    watts = rail_watts(sources.rail) if sources.rail is not None else None
    if watts is not None:
        values[fields.POWER_USAGE] = watts
    memory = memory_mib(read_text(sources.meminfo) or "") if sources.meminfo else None
    if memory is not None:
        values[fields.FB_USED], values[fields.FB_FREE] = memory
    return values


def labels(gpu: Gpu) -> GpuLabels:
    # the L4T release stands for the driver: nvgpu (and Thor's driver) ship with it, one version per release
    return GpuLabels(gpu=str(gpu.index), uuid=gpu.id, device=f"nvidia{gpu.index}", model_name=gpu.name,
                     driver_version=gpu.properties.get("l4t", ""))


class OpenRmUtilization:
    """GPU_UTIL of an iGPU on the open driver (Thor) from NVML, one session for the collector's life."""

    def __init__(self, nvml_module: Any = None) -> None:
        self._nvml_module = nvml_module
        self._nvml: Any = None
        self._handles: dict[str, Any] = {}
        self._failed = False

    def _start(self) -> bool:
        if self._nvml is not None:
            return True
        if self._failed:
            return False
        try:
            nvml = load_nvml(self._nvml_module)
            nvml_init(nvml)
        except DiscoveryError as exc:
            log.warning("no GPU utilization for Thor's GPU: %s", exc)
            self._failed = True
            return False
        self._nvml = nvml
        return True

    def read(self, gpu: Gpu) -> float | None:
        uuid = gpu.properties.get("uuid", "")
        if not uuid or not self._start():
            return None
        nvml = self._nvml
        try:
            if uuid not in self._handles:
                self._handles[uuid] = nvml.nvmlDeviceGetHandleByUUID(uuid.encode())
            return float(nvml.nvmlDeviceGetUtilizationRates(self._handles[uuid]).gpu)
        except Exception as exc:  # not supported, GPU lost, an older binding: the field stays out
            log.debug("NVML utilization of %s: %s", uuid, exc)
            self._handles.pop(uuid, None)
            return None

    def close(self) -> None:
        if self._nvml is not None:
            nvml_shutdown(self._nvml)
        self._nvml, self._handles = None, {}


class TegraCollector:
    name = "tegra"

    def __init__(self, gpus: Sequence[Gpu], root: str = "/", xids: XidSource = no_xids,
                 nvml_module: Any = None) -> None:
        self._gpus = [gpu for gpu in gpus if gpu.backend == "tegra"]
        self._root = root
        self._xids = xids
        self._sources: Sources | None = None
        self._openrm = OpenRmUtilization(nvml_module)

    @property
    def sources(self) -> Sources:
        """The files, looked up on first use: sysfs layout does not change while the board runs."""
        if self._sources is None:
            self._sources = find_sources(self._root)
            log.debug("Jetson telemetry sources: %s", self._sources)
        return self._sources

    def collect(self) -> list[GpuSample]:
        if not self._gpus:
            return []
        values = read_values(self.sources)
        samples = []
        for gpu in self._gpus:
            own = dict(values)
            if fields.GPU_UTIL not in own and gpu.properties.get("gpu_driver") == OPENRM:
                busy = self._openrm.read(gpu)
                if busy is not None:
                    own[fields.GPU_UTIL] = busy
            xid = self._xids(gpu.id)
            if xid is not None:
                own[fields.XID_ERRORS] = xid
            samples.append(GpuSample(labels(gpu), own))
        return samples

    def close(self) -> None:
        self._openrm.close()
