"""Telemetry of discrete GPUs from NVML (nvidia-ml-py), the calls DCGM itself makes for these fields.

One NVML session for the collector's life (nvmlInit is reference-counted, so the health
monitor's own session is unaffected); handles and static labels are looked up once. Each
query stands alone: one the GPU or driver does not support leaves its field out. Fields
measured between two scrapes (GPM's profiling metrics, NVLink traffic) are nvml_rates'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..discovery.base import DiscoveryError
from ..discovery.nvml_lib import is_nvml_error, load_nvml, nvml_init, nvml_shutdown, text
from ..model import Gpu
from . import fields
from .collector import GpuLabels, GpuSample, XidSource, no_xids
from .nvml_rates import GpmReader, NvlinkReader, field_number

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# nvml.h constants, used when an old nvidia-ml-py lacks the name
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
NVML_TEMPERATURE_GPU = 0
NVML_FI_DEV_MEMORY_TEMP = 82


class NvmlCollector:
    name = "nvml"

    def __init__(self, gpus: Sequence[Gpu], nvml_module: Any = None, xids: XidSource = no_xids) -> None:
        self._gpus = [gpu for gpu in gpus if gpu.backend == "nvml"]
        self._nvml_module = nvml_module
        self._xids = xids
        self._nvml: Any = None
        self._devices: list[tuple[Gpu, Any, GpuLabels]] = []
        self._rates: dict[str, list[GpmReader | NvlinkReader]] = {}  # GPU ID -> its between-scrapes readers
        self._warned = False

    def _start(self) -> bool:
        if self._nvml is not None:
            return True
        try:
            nvml = load_nvml(self._nvml_module)
            nvml_init(nvml)
        except DiscoveryError as exc:
            if not self._warned:
                log.warning("no NVML telemetry: %s", exc)
                self._warned = True
            return False
        driver = self._call(nvml, lambda: text(nvml.nvmlSystemGetDriverVersion())) or ""
        devices = []
        for gpu in self._gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu.id.encode())  # bytes: old nvidia-ml-py takes no str
            except Exception as exc:
                log.warning("no telemetry for GPU %s: NVML cannot find it (%s)", gpu.id, exc)
                continue
            pci = self._call(nvml, lambda h=handle: nvml.nvmlDeviceGetPciInfo(h))
            devices.append((gpu, handle, GpuLabels(
                gpu=str(gpu.index), uuid=gpu.id, device=f"nvidia{gpu.index}", model_name=gpu.name,
                pci_bus_id=text(pci.busId) if pci is not None else "", driver_version=driver)))
        self._nvml, self._devices = nvml, devices
        for gpu, handle, _ in devices:
            gpm = GpmReader.open(nvml, handle)
            self._rates[gpu.id] = [reader for reader in (gpm, NvlinkReader(nvml, handle)) if reader is not None]
        return True

    @staticmethod
    def _call(nvml: Any, query: Callable[[], Any]) -> Any:
        """One NVML query, or None when the GPU, driver or nvidia-ml-py cannot answer it."""
        try:
            return query()
        except AttributeError:  # this nvidia-ml-py predates the function
            return None
        except Exception as exc:
            if not is_nvml_error(nvml, exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                log.debug("NVML query failed: %s", exc)
            return None

    def collect(self) -> list[GpuSample]:
        if not self._gpus or not self._start():
            return []
        samples = []
        for gpu, handle, gpu_labels in self._devices:
            values = self.read(handle)
            for reader in self._rates.get(gpu.id, ()):
                values.update(reader.read())
            xid = self._xids(gpu.id)
            if xid is not None:
                values[fields.XID_ERRORS] = xid
            samples.append(GpuSample(gpu_labels, values))
        return samples

    def read(self, handle: Any) -> dict[str, float]:
        nvml = self._nvml
        call = self._call
        values: dict[str, float] = {}

        def constant(name: str, default: int) -> int:
            return int(getattr(nvml, name, default))

        def put(name: str, value: Any) -> None:
            if value is not None:
                values[name] = value

        rates = call(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        if rates is not None:
            put(fields.GPU_UTIL, int(rates.gpu))
            put(fields.MEM_COPY_UTIL, int(rates.memory))
        for name, function in ((fields.ENC_UTIL, "nvmlDeviceGetEncoderUtilization"),
                               (fields.DEC_UTIL, "nvmlDeviceGetDecoderUtilization")):
            busy = call(nvml, lambda f=function: getattr(nvml, f)(handle))
            put(name, int(busy[0]) if busy is not None else None)
        for name, clock in ((fields.SM_CLOCK, constant("NVML_CLOCK_SM", NVML_CLOCK_SM)),
                            (fields.MEM_CLOCK, constant("NVML_CLOCK_MEM", NVML_CLOCK_MEM))):
            put(name, call(nvml, lambda c=clock: int(nvml.nvmlDeviceGetClockInfo(handle, c))))
        sensor = constant("NVML_TEMPERATURE_GPU", NVML_TEMPERATURE_GPU)
        put(fields.GPU_TEMP, call(nvml, lambda: int(nvml.nvmlDeviceGetTemperature(handle, sensor))))
        put(fields.MEMORY_TEMP, self._field_value(handle, constant("NVML_FI_DEV_MEMORY_TEMP", NVML_FI_DEV_MEMORY_TEMP)))
        milliwatts = call(nvml, lambda: int(nvml.nvmlDeviceGetPowerUsage(handle)))
        put(fields.POWER_USAGE, milliwatts / 1000 if milliwatts is not None else None)
        put(fields.TOTAL_ENERGY_CONSUMPTION, call(nvml, lambda: int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))))
        put(fields.PCIE_REPLAY_COUNTER, call(nvml, lambda: int(nvml.nvmlDeviceGetPcieReplayCounter(handle))))
        values.update(self._memory(handle))
        rows = call(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        if rows is not None:
            correctable, uncorrectable, _pending, failed = (int(v) for v in rows)
            values[fields.CORRECTABLE_REMAPPED_ROWS] = correctable
            values[fields.UNCORRECTABLE_REMAPPED_ROWS] = uncorrectable
            values[fields.ROW_REMAP_FAILURE] = 1 if failed else 0
        return values

    def _memory(self, handle: Any) -> dict[str, float]:
        """FB_* in MiB: NVML's v2 memory info keeps the driver's reserve out of "used", as DCGM reports it."""
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        info = self._call(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=version)) if version else None
        if info is not None:
            return {fields.FB_FREE: int(info.free) // MIB, fields.FB_USED: int(info.used) // MIB,
                    fields.FB_RESERVED: int(info.reserved) // MIB}
        info = self._call(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        if info is None:
            return {}
        return {fields.FB_FREE: int(info.free) // MIB, fields.FB_USED: int(info.used) // MIB}

    def _field_value(self, handle: Any, field_id: int) -> float | None:
        nvml = self._nvml
        found = self._call(nvml, lambda: nvml.nvmlDeviceGetFieldValues(handle, [field_id]))
        return field_number(found[0]) if found else None

    def close(self) -> None:
        if self._nvml is not None:
            for readers in self._rates.values():
                for reader in readers:
                    if isinstance(reader, GpmReader):
                        reader.close()
            nvml_shutdown(self._nvml)
            self._nvml, self._devices, self._rates = None, [], {}
