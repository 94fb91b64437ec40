"""A scriptable stand-in for nvidia-ml-py's `pynvml` module.

Same function, constant and error-class names as pynvml, so code under test cannot tell
the difference. Scripting: `FakeNvml([FakeGpu(...), ...])`, then `emit_xid(uuid, 79)`,
`emit_wait_error(...)`, `gpu.answering = False`, `library_missing=True`, `init_error=...`.
Telemetry readings are FakeGpu fields (`gpu_util`, `sm_clock_mhz`, `power_mw`, ...); None
makes the query answer NVML_ERROR_NOT_SUPPORTED, as a GPU without that sensor does.

What NVML measures between two reads is modelled with a clock the test moves (`advance(s)`):
a GPU's `gpm_rates` (GPM metric -> its value while the clock runs, e.g. percent busy) and
`nvlink_kib_per_s` accumulate as counters, a GPM sample or an NVLink field value captures
them with the time, and nvmlGpmMetricsGet gives (counter2 - counter1) / (t2 - t1), as the
hardware's counters do.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

_MESSAGES = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Like pynvml: NVMLError(code) builds the matching subclass; `.value` is the code."""

    _by_code: dict[int, type[NVMLError]] = {}
    value = NVML_ERROR_UNKNOWN

    def __new__(cls, value: int | None = None) -> NVMLError:
        if cls is NVMLError and value is not None:
            cls = NVMLError._by_code.get(value, NVMLError)
        return Exception.__new__(cls)

    def __init__(self, value: int | None = None) -> None:
        if value is not None:
            self.value = value
        super().__init__(self.value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, code: int) -> type[NVMLError]:
    cls = type(name, (NVMLError,), {"value": code})
    NVMLError._by_code[code] = cls
    return cls


NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_Timeout = _error_class("NVMLError_Timeout", NVML_ERROR_TIMEOUT)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class("NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_LibRmVersionMismatch = _error_class(
    "NVMLError_LibRmVersionMismatch", NVML_ERROR_LIB_RM_VERSION_MISMATCH
)
NVMLError_Unknown = _error_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypePState = 0x4
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeClock = 0x10
nvmlEventTypeNone = 0x0
ALL_HEALTH_EVENTS = (
    nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeSingleBitEccError
)

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_VALUE_TYPE_UNSIGNED_INT = 1
nvmlMemory_v2 = 0x02000028  # nvmlStructVersion(nvmlMemory_v2_t, 2), as nvidia-ml-py defines it
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_TEMPERATURE_GPU = 0
NVML_BRAND_UNKNOWN = 0
NVML_BRAND_QUADRO = 1
NVML_BRAND_TESLA = 2
NVML_BRAND_GEFORCE = 5
NVML_BRAND_NVIDIA = 14
NVML_BRAND_COUNT = 20
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
# the GPU's place in an NVLink fabric (nvml.h nvmlGpuFabricInfo*; the structures as nvidia-ml-py 13.580 declares them)
NVML_DEVICE_UUID_BUFFER_SIZE = 80
NVML_GPU_FABRIC_UUID_LEN = 16
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
nvmlGpuFabricInfo_v2 = 0x02000024


class c_nvmlGpuFabricInfo_t(ctypes.Structure):  # pynvml's name
    _fields_ = [("clusterUuid", ctypes.c_uint8 * NVML_DEVICE_UUID_BUFFER_SIZE), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint)]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):  # pynvml's name
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint),
                ("healthMask", ctypes.c_uint32)]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v2)


c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_MAX = 210
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    memory_mib: int = 40960
    minor: int | None = 0  # None: nvmlDeviceGetMinorNumber is not supported
    pci_bus_id: str = "00000000:3B:00.0"
    numa_node: int | None = 0  # None: nvmlDeviceGetNumaNodeId is not supported
    mig_mode: tuple[int, int] | None = (0, 0)  # None: not supported (pre-Ampere)
    compute_capability: tuple[int, int] = (8, 0)
    brand: int = NVML_BRAND_TESLA
    supported_events: int = ALL_HEALTH_EVENTS
    answering: bool = True  # False: every query on it raises GPU is lost
    refuse_ecc_registration: bool = False  # lists ECC events but RegisterEvents refuses them
    # telemetry (None: the query is not supported on this GPU)
    gpu_util: int | None = 0
    memory_util: int | None = 0
    encoder_util: int | None = 0
    decoder_util: int | None = 0
    sm_clock_mhz: int | None = 1410
    memory_clock_mhz: int | None = 1215
    temperature_c: int | None = 40
    memory_temperature_c: int | None = None  # HBM GPUs only
    power_mw: int | None = 62000
    energy_mj: int | None = 0
    pcie_replays: int | None = 0
    memory_used_mib: int = 0
    memory_reserved_mib: int | None = 0  # None: the driver has no nvmlDeviceGetMemoryInfo_v2
    remapped_rows: tuple[int, int, int, int] | None = None  # (correctable, uncorrectable, pending, failed)
    # NVLink fabric (Hopper and newer on NVSwitch boards); None: the query is not supported (A100, PCIe GPUs)
    fabric_state: int | None = None
    fabric_status: int = NVML_SUCCESS
    gpm_rates: dict[int, float] | None = None  # None: no GPM (before Hopper); else metric id -> value now
    nvlink_kib_per_s: tuple[float, float] | None = None  # (TX, RX) now; None: no NVLink
    # the counters behind them, advanced by FakeNvml.advance
    gpm_counters: dict[int, float] = field(default_factory=dict)
    nvlink_kib: list[float] = field(default_factory=lambda: [0.0, 0.0])


@dataclass(frozen=True)
class FakeHandle:
    gpu: FakeGpu | None  # None: a device NVML cannot name (unknown UUID)


@dataclass
class _Memory:
    total: int
    free: int
    used: int
    reserved: int = 0
    version: int = 0


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _Value:  # nvmlValue_t: one member per value type
    uiVal: int = 0
    ullVal: int = 0


@dataclass
class _FieldValue:  # nvmlFieldValue_t
    fieldId: int
    nvmlReturn: int = NVML_SUCCESS
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_INT
    value: _Value = field(default_factory=_Value)
    scopeId: int = 0
    timestamp: int = 0  # microseconds


@dataclass
class _GpmSupport:  # nvmlGpmSupport_t
    version: int = NVML_GPM_SUPPORT_VERSION
    isSupportedDevice: int = 0


@dataclass
class FakeGpmSample:  # what nvmlGpmSampleAlloc hands out (a pointer in pynvml)
    uuid: str = ""
    time: float | None = None
    counters: dict[int, float] = field(default_factory=dict)
    freed: bool = False


@dataclass
class _GpmMetric:  # nvmlGpmMetric_t
    metricId: int = 0
    nvmlReturn: int = NVML_SUCCESS
    value: float = 0.0


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [_GpmMetric() for _ in range(NVML_GPM_METRIC_MAX)]


@dataclass
class _PciInfo:
    busId: bytes
    domain: int = 0
    bus: int = 0


@dataclass
class FakeEventData:
    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeEventSet:
    registered: dict[str, int] = field(default_factory=dict)  # uuid -> mask
    freed: bool = False


class FakeNvml:
    """An object that quacks like the pynvml module; pass it as `nvml_module`.

    Function and field names are pynvml's (camelCase), hence no snake_case here.
    """

    # Constants and error classes, reachable as attributes like pynvml's module globals.
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_LibRmVersionMismatch = NVMLError_LibRmVersionMismatch
    NVMLError_Unknown = NVMLError_Unknown
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = NVML_ERROR_LIB_RM_VERSION_MISMATCH
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN
    nvmlEventTypeSingleBitEccError = nvmlEventTypeSingleBitEccError
    nvmlEventTypeDoubleBitEccError = nvmlEventTypeDoubleBitEccError
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    nvmlEventTypeNone = nvmlEventTypeNone
    NVML_DEVICE_MIG_DISABLE = NVML_DEVICE_MIG_DISABLE
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_GRAPHICS = NVML_CLOCK_GRAPHICS
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVML_FI_DEV_MEMORY_TEMP = NVML_FI_DEV_MEMORY_TEMP
    NVML_VALUE_TYPE_UNSIGNED_INT = NVML_VALUE_TYPE_UNSIGNED_INT
    nvmlMemory_v2 = nvmlMemory_v2
    NVML_BRAND_UNKNOWN = NVML_BRAND_UNKNOWN
    NVML_BRAND_QUADRO = NVML_BRAND_QUADRO
    NVML_BRAND_TESLA = NVML_BRAND_TESLA
    NVML_BRAND_GEFORCE = NVML_BRAND_GEFORCE
    NVML_BRAND_NVIDIA = NVML_BRAND_NVIDIA
    NVML_BRAND_COUNT = NVML_BRAND_COUNT
    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    NVML_GPU_FABRIC_STATE_NOT_STARTED = NVML_GPU_FABRIC_STATE_NOT_STARTED
    NVML_GPU_FABRIC_STATE_IN_PROGRESS = NVML_GPU_FABRIC_STATE_IN_PROGRESS
    NVML_GPU_FABRIC_STATE_COMPLETED = NVML_GPU_FABRIC_STATE_COMPLETED
    c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfoV_t
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    NVML_GPM_METRIC_GRAPHICS_UTIL = NVML_GPM_METRIC_GRAPHICS_UTIL
    NVML_GPM_METRIC_SM_UTIL = NVML_GPM_METRIC_SM_UTIL
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = NVML_GPM_METRIC_ANY_TENSOR_UTIL
    NVML_GPM_METRIC_DRAM_BW_UTIL = NVML_GPM_METRIC_DRAM_BW_UTIL
    NVML_GPM_METRIC_PCIE_TX_PER_SEC = NVML_GPM_METRIC_PCIE_TX_PER_SEC
    NVML_GPM_METRIC_PCIE_RX_PER_SEC = NVML_GPM_METRIC_PCIE_RX_PER_SEC
    NVML_GPM_METRIC_MAX = NVML_GPM_METRIC_MAX
    NVML_GPM_METRICS_GET_VERSION = NVML_GPM_METRICS_GET_VERSION
    NVML_GPM_SUPPORT_VERSION = NVML_GPM_SUPPORT_VERSION
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        driver_version: str = "550.54.15",
        cuda_driver_version: int = 12040,  # NVML's encoding of CUDA 12.4
        library_missing: bool = False,
        init_error: int | None = None,
        has_numa_function: bool = True,
        has_fabric_info_v: bool = True,
    ) -> None:
        self.gpus = list(gpus or [])
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.library_missing = library_missing
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0
        self.wait_calls = 0
        self.event_sets: list[FakeEventSet] = []
        self._pending: deque[FakeEventData | NVMLError] = deque()
        self._cond = threading.Condition()
        self._has_numa_function = has_numa_function
        self._has_fabric_info_v = has_fabric_info_v  # False: an nvidia-ml-py before nvmlDeviceGetGpuFabricInfoV
        self.fabric_calls = 0
        self.now = 1_000_000.0  # seconds on NVML's clock (CPU time of samples and field values)
        self.gpm_samples: list[FakeGpmSample] = []

    def __getattribute__(self, name: str) -> Any:
        # Old nvidia-ml-py releases lack nvmlDeviceGetNumaNodeId: the attribute does not exist.
        if name == "nvmlDeviceGetNumaNodeId" and not object.__getattribute__(self, "_has_numa_function"):
            raise AttributeError(name)
        if name == "nvmlDeviceGetGpuFabricInfoV" and not object.__getattribute__(self, "_has_fabric_info_v"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # -- scripting ------------------------------------------------------------------------

    def gpu(self, uuid: str) -> FakeGpu:
        return next(g for g in self.gpus if g.uuid == uuid)

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass: every GPU's GPM and NVLink counters grow at their current rates."""
        self.now += seconds
        for gpu in self.gpus:
            for metric, rate in (gpu.gpm_rates or {}).items():
                gpu.gpm_counters[metric] = gpu.gpm_counters.get(metric, 0.0) + rate * seconds
            if gpu.nvlink_kib_per_s is not None:
                gpu.nvlink_kib = [total + rate * seconds
                                  for total, rate in zip(gpu.nvlink_kib, gpu.nvlink_kib_per_s, strict=True)]

    def emit_event(self, uuid: str | None, event_type: int, event_data: int = 0) -> None:
        """Queue an event; uuid None: from a device NVML cannot name."""
        handle = FakeHandle(self.gpu(uuid) if uuid is not None else None)
        self._push(FakeEventData(handle, event_type, event_data))

    def emit_xid(self, uuid: str | None, xid: int) -> None:
        self.emit_event(uuid, nvmlEventTypeXidCriticalError, xid)

    def emit_wait_error(self, code: int = NVML_ERROR_UNKNOWN) -> None:
        """The next nvmlEventSetWait fails with this code instead of returning an event."""
        self._push(NVMLError(code))

    def _push(self, item: FakeEventData | NVMLError) -> None:
        with self._cond:
            self._pending.append(item)
            self._cond.notify_all()

    # -- library lifecycle ----------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.library_missing:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.init_calls += 1

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_driver_version

    # -- devices --------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._answering(FakeHandle(self.gpus[index]))

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> FakeHandle:
        if not isinstance(uuid, bytes):  # nvidia-ml-py 11.450/11.495 pass it to c_char_p unconverted
            raise TypeError("bytes or integer address expected instead of str instance")
        uuid = uuid.decode()
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return self._answering(FakeHandle(gpu))
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    @staticmethod
    def _answering(handle: FakeHandle) -> FakeHandle:
        if handle.gpu is None or not handle.gpu.answering:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return handle

    def nvmlDeviceGetGpuFabricInfoV(self, handle: FakeHandle, info: Any) -> int:
        """As nvidia-ml-py: `info` is byref() of a c_nvmlGpuFabricInfoV_t whose version the caller's
        structure set."""
        if info._obj.version != nvmlGpuFabricInfo_v2:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return self._fabric(handle, info)

    def nvmlDeviceGetGpuFabricInfo(self, handle: FakeHandle, info: Any) -> int:
        return self._fabric(handle, info)

    def _fabric(self, handle: FakeHandle, info: Any) -> int:
        self.fabric_calls += 1
        gpu = self._gpu(handle)
        if gpu.fabric_state is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info._obj.state = gpu.fabric_state
        info._obj.status = gpu.fabric_status
        return NVML_SUCCESS

    def _gpu(self, handle: FakeHandle) -> FakeGpu:
        gpu = self._answering(handle).gpu
        assert gpu is not None
        return gpu

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        if handle.gpu is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return handle.gpu.uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> _Memory:
        """v1 counts the driver's reserve as used; v2 (nvmlDeviceGetMemoryInfo_v2) reports it apart."""
        gpu = self._gpu(handle)
        mib = 1024 * 1024
        total, used = gpu.memory_mib * mib, gpu.memory_used_mib * mib
        if not version:
            reserved = (gpu.memory_reserved_mib or 0) * mib
            return _Memory(total=total, free=total - used - reserved, used=used + reserved)
        if gpu.memory_reserved_mib is None:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        reserved = gpu.memory_reserved_mib * mib
        return _Memory(total=total, free=total - used - reserved, used=used, reserved=reserved, version=version)

    @staticmethod
    def _reading(value: Any) -> Any:
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        return self._reading(self._gpu(handle).temperature_c)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> _Utilization:
        gpu = self._gpu(handle)
        return _Utilization(gpu=self._reading(gpu.gpu_util), memory=self._reading(gpu.memory_util))

    def nvmlDeviceGetEncoderUtilization(self, handle: FakeHandle) -> list[int]:
        return [self._reading(self._gpu(handle).encoder_util), 167000]  # [utilization, sampling period in us]

    def nvmlDeviceGetDecoderUtilization(self, handle: FakeHandle) -> list[int]:
        return [self._reading(self._gpu(handle).decoder_util), 167000]

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        gpu = self._gpu(handle)
        clocks = {NVML_CLOCK_SM: gpu.sm_clock_mhz, NVML_CLOCK_MEM: gpu.memory_clock_mhz}
        if clock_type not in clocks:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._reading(clocks[clock_type])

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, field_ids: list) -> list[_FieldValue]:
        """Ids or (id, scopeId) pairs, as pynvml takes them; NVLink counters only for scope UINT_MAX
        (all links, summed) here."""
        gpu = self._gpu(handle)
        out = []
        stamp = int(self.now * 1e6)
        for entry in field_ids:
            field_id, scope = entry if isinstance(entry, tuple) else (entry, 0)
            if field_id == NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temperature_c is not None:
                out.append(_FieldValue(field_id, value=_Value(uiVal=gpu.memory_temperature_c), timestamp=stamp))
            elif (field_id in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
                  and gpu.nvlink_kib_per_s is not None and scope == 0xFFFFFFFF):
                kib = gpu.nvlink_kib[field_id - NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX]
                out.append(_FieldValue(field_id, valueType=NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                                       value=_Value(ullVal=int(kib)), scopeId=scope, timestamp=stamp))
            else:
                out.append(_FieldValue(field_id, NVML_ERROR_NOT_SUPPORTED, scopeId=scope))
        return out

    # -- GPM (Hopper and later) -----------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: FakeHandle) -> _GpmSupport:
        return _GpmSupport(isSupportedDevice=int(self._gpu(handle).gpm_rates is not None))

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        sample = FakeGpmSample()
        self.gpm_samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        sample.freed = True

    def nvmlGpmSampleGet(self, handle: FakeHandle, sample: FakeGpmSample) -> FakeGpmSample:
        gpu = self._gpu(handle)
        if gpu.gpm_rates is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if sample.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        sample.uuid, sample.time = gpu.uuid, self.now
        sample.counters = {metric: gpu.gpm_counters.get(metric, 0.0) for metric in gpu.gpm_rates}
        return sample

    def nvmlGpmMetricsGet(self, request: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        first, second = request.sample1, request.sample2
        if (request.version != NVML_GPM_METRICS_GET_VERSION or first is None or second is None
                or first.time is None or second.time is None or second.time <= first.time
                or first.uuid != second.uuid):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        seconds = second.time - first.time
        for metric in request.metrics[:request.numMetrics]:
            if metric.metricId in second.counters:
                metric.nvmlReturn = NVML_SUCCESS
                metric.value = (second.counters[metric.metricId] - first.counters.get(metric.metricId, 0.0)) / seconds
            else:
                metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return request

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._reading(self._gpu(handle).power_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        return self._reading(self._gpu(handle).energy_mj)

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:
        return self._reading(self._gpu(handle).pcie_replays)

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        return self._reading(self._gpu(handle).remapped_rows)

    def nvmlDeviceGetMinorNumber(self, handle: FakeHandle) -> int:
        gpu = self._gpu(handle)
        if gpu.minor is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.minor

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> _PciInfo:
        return _PciInfo(busId=self._gpu(handle).pci_bus_id.encode())

    def nvmlDeviceGetNumaNodeId(self, handle: FakeHandle) -> int:
        gpu = self._gpu(handle)
        if gpu.numa_node is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa_node

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeHandle) -> tuple[int, int]:
        return self._gpu(handle).compute_capability

    def nvmlDeviceGetBrand(self, handle: FakeHandle) -> int:
        return self._gpu(handle).brand

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        gpu = self._gpu(handle)
        if gpu.mig_mode is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return list(gpu.mig_mode)

    # -- events ---------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeHandle) -> int:
        supported = self._gpu(handle).supported_events
        if supported == 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return supported

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, event_types: int, event_set: FakeEventSet) -> None:
        gpu = self._gpu(handle)
        if event_types & ~gpu.supported_events:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if gpu.refuse_ecc_registration and event_types & ~nvmlEventTypeXidCriticalError:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        event_set.registered[gpu.uuid] = event_types

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeoutms: int) -> FakeEventData:
        if event_set.freed:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        with self._cond:
            self.wait_calls += 1
            if not self._pending:
                self._cond.wait(timeoutms / 1000)
            if not self._pending:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            item = self._pending.popleft()
        if isinstance(item, NVMLError):
            raise item
        return item

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        event_set.freed = True


def make_gpus(count: int, **overrides: Any) -> list[FakeGpu]:
    """`count` distinct GPUs (UUIDs GPU-0000..., minors 0.., bus ids 3B, 3C, ...)."""
    return [
        FakeGpu(
            uuid=f"GPU-{i:08d}-1111-2222-3333-444444444444",
            minor=i,
            pci_bus_id=f"00000000:{0x3B + i:02X}:00.0",
            numa_node=i % 2,
            **overrides,
        )
        for i in range(count)
    ]
