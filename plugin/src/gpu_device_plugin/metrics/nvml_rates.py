"""Fields NVML gives as rates between two reads: GPM's profiling metrics and NVLink traffic.

DCGM's profiling fields (DCGM_FI_PROF_*) come from its own profiling module; on Hopper and
later GPUs NVML measures the same activity with GPU Performance Monitoring (GPM): two samples,
and nvmlGpmMetricsGet gives each metric over the time between them. A scrape takes a sample,
so each value covers the interval since the previous scrape; the first scrape has none.
GPUs before Hopper answer nvmlGpmQueryDeviceSupport with "not supported": no PROF series.

NVLink: NVML counts each direction's data in KiB (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX,
all links with scope UINT_MAX, field 449's source in DCGM); the rate between two scrapes in
MiB/s is DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL. A GPU without NVLink answers "not supported".
"""

from __future__ import annotations

import logging
from typing import Any

from . import fields

log = logging.getLogger(__name__)

MIB = 1024 * 1024
ALL_LINKS = 0xFFFFFFFF  # nvmlFieldValue_t scopeId: the sum over every link
NVML_SUCCESS = 0
# (DCGM field, nvml.h GPM metric name, its value, scale to DCGM's unit): GPM gives percent and MiB/s
GPM_METRICS = (
    (fields.GR_ENGINE_ACTIVE, "NVML_GPM_METRIC_GRAPHICS_UTIL", 1, 0.01),
    (fields.PIPE_TENSOR_ACTIVE, "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5, 0.01),
    (fields.DRAM_ACTIVE, "NVML_GPM_METRIC_DRAM_BW_UTIL", 10, 0.01),
    (fields.PCIE_TX_BYTES, "NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20, MIB),
    (fields.PCIE_RX_BYTES, "NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21, MIB),
)
NVLINK_FIELDS = (("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138), ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139))
# nvmlValueType_t -> the member of nvmlValue_t that holds it
VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def field_number(field: Any) -> float | None:
    """The value of one nvmlFieldValue_t, or None when NVML did not answer it."""
    if int(field.nvmlReturn) != NVML_SUCCESS:
        return None
    member = VALUE_MEMBERS.get(int(field.valueType))
    return float(getattr(field.value, member)) if member else None


class GpmReader:
    """The PROF fields of one GPU from GPM samples, two kept and reused (NVML allocates them)."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._samples: list[Any] = []
        self._previous: Any = None  # the sample the next interval starts at

    @classmethod
    def open(cls, nvml: Any, handle: Any) -> GpmReader | None:
        """A reader when the GPU has GPM (Hopper and later), else None."""
        try:
            if not int(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice):
                return None
            reader = cls(nvml, handle)
            reader._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            return reader
        except Exception as exc:  # an old binding or driver without GPM, or not supported
            log.debug("no GPM: %s", exc)
            return None

    def read(self) -> dict[str, float]:
        nvml = self._nvml
        current = self._samples[1] if self._previous is self._samples[0] else self._samples[0]
        try:
            nvml.nvmlGpmSampleGet(self._handle, current)
        except Exception as exc:
            log.debug("GPM sample failed: %s", exc)
            self._previous = None
            return {}
        previous, self._previous = self._previous, current
        if previous is None:
            return {}  # the first sample opens the first interval
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = int(getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1))
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = previous, current
        for index, (_, name, number, _) in enumerate(GPM_METRICS):
            request.metrics[index].metricId = int(getattr(nvml, name, number))
        try:
            nvml.nvmlGpmMetricsGet(request)
        except Exception as exc:
            log.debug("GPM metrics failed: %s", exc)
            return {}
        out = {}
        for index, (field, _, _, scale) in enumerate(GPM_METRICS):
            metric = request.metrics[index]
            if int(metric.nvmlReturn) == NVML_SUCCESS:
                out[field] = round(float(metric.value) * scale, 6)
        return out

    def close(self) -> None:
        for sample in self._samples:
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except Exception as exc:
                log.debug("GPM sample free failed: %s", exc)
        self._samples, self._previous = [], None


class NvlinkReader:
    """DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL of one GPU: KiB sent and received, between two reads."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._previous: tuple[float, float] | None = None  # (NVML's timestamp in us, KiB both ways)
        self._absent = False  # the GPU has no NVLink: stop asking

    def read(self) -> dict[str, float]:
        if self._absent:
            return {}
        nvml = self._nvml
        ids = [(int(getattr(nvml, name, number)), ALL_LINKS) for name, number in NVLINK_FIELDS]
        try:
            found = nvml.nvmlDeviceGetFieldValues(self._handle, ids)
        except Exception as exc:
            log.debug("NVLink counters: %s", exc)
            return {}
        numbers = [field_number(field) for field in found]
        if any(number is None for number in numbers):
            self._absent = all(int(field.nvmlReturn) == int(getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3))
                               for field in found)
            self._previous = None
            return {}
        now = (max(float(field.timestamp) for field in found), sum(n for n in numbers if n is not None))
        previous, self._previous = self._previous, now
        if previous is None or now[0] <= previous[0] or now[1] < previous[1]:
            return {}  # the first read, or the driver's counters started again
        kib_per_s = (now[1] - previous[1]) / ((now[0] - previous[0]) / 1e6)
        return {fields.NVLINK_BANDWIDTH_TOTAL: round(kib_per_s / 1024, 3)}
