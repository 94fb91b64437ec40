"""The fields /metrics can carry: dcgm-exporter's default counter list, as data.

The table below has the format of dcgm-exporter's etc/default-counters.csv (field, Prometheus
type, help), and names every field that list enables, with the same names, types and units,
so dashboards and alerts written for dcgm-exporter work unchanged, less the vGPU licence
(only a vGPU guest has one; our images run the driver on bare metal) and with one type
corrected: DCGM publishes NVLINK_BANDWIDTH_TOTAL as a rate, which dcgm-exporter's list calls a
counter. The help texts are our own. A field is exported only for a GPU whose collector reads a value for it: what the
hardware cannot give is absent, never zero. `label` rows become labels of every series.
"""

from typing import NamedTuple

SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
MEM_CLOCK = "DCGM_FI_DEV_MEM_CLOCK"
MEMORY_TEMP = "DCGM_FI_DEV_MEMORY_TEMP"
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
TOTAL_ENERGY_CONSUMPTION = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
PCIE_REPLAY_COUNTER = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"
ENC_UTIL = "DCGM_FI_DEV_ENC_UTIL"
DEC_UTIL = "DCGM_FI_DEV_DEC_UTIL"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
UNCORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
CORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
NVLINK_BANDWIDTH_TOTAL = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
DRIVER_VERSION = "DCGM_FI_DRIVER_VERSION"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
PIPE_TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
PCIE_TX_BYTES = "DCGM_FI_PROF_PCIE_TX_BYTES"
PCIE_RX_BYTES = "DCGM_FI_PROF_PCIE_RX_BYTES"

COUNTERS_CSV = """\
# DCGM field, Prometheus type, help
DCGM_FI_DEV_SM_CLOCK, gauge, Current SM (graphics) clock (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Current memory clock (in MHz).
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power the GPU draws now (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Energy the GPU used since the driver loaded (in mJ).
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, PCIe replays (retries) so far.
DCGM_FI_DEV_GPU_UTIL, gauge, Share of the last sample period the GPU was busy (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Share of the last sample period device memory was read or written (in %).
DCGM_FI_DEV_ENC_UTIL, gauge, Video encoder busy (in %).
DCGM_FI_DEV_DEC_UTIL, gauge, Video decoder busy (in %).
DCGM_FI_DEV_XID_ERRORS, gauge, The last Xid error seen on this GPU (0: none since the exporter started).
DCGM_FI_DEV_FB_FREE, gauge, GPU memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, GPU memory used (in MiB).
DCGM_FI_DEV_FB_RESERVED, gauge, GPU memory the driver reserves (in MiB).
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, gauge, NVLink data sent and received on all links since the last scrape (in MiB/s).
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Memory rows remapped after uncorrectable errors.
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, counter, Memory rows remapped after correctable errors.
DCGM_FI_DEV_ROW_REMAP_FAILURE, gauge, 1 when a memory row could not be remapped.
DCGM_FI_DRIVER_VERSION, label, Driver version.
DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of the time since the last scrape a graphics/compute engine was busy (0-1).
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of the time since the last scrape the SMs ran tensor operations (0-1).
DCGM_FI_PROF_DRAM_ACTIVE, gauge, Ratio of the device memory bandwidth used since the last scrape (0-1).
DCGM_FI_PROF_PCIE_TX_BYTES, gauge, PCIe data the GPU sent since the last scrape (in B/s).
DCGM_FI_PROF_PCIE_RX_BYTES, gauge, PCIe data the GPU received since the last scrape (in B/s).
"""

KINDS = ("gauge", "counter", "label")


class Field(NamedTuple):
    name: str  # the DCGM field name, used as the metric name
    kind: str  # gauge | counter | label
    help: str


def parse_counters(text: str) -> tuple[Field, ...]:
    """Rows of `field, type, help`; '#' starts a comment. A bad row is a ValueError naming it."""
    fields: list[Field] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split(",", 2)]
        if len(parts) != 3 or not parts[0].startswith("DCGM_") or parts[1] not in KINDS:
            raise ValueError(f"counter line {number} is not 'DCGM_FIELD, {'|'.join(KINDS)}, help': {raw!r}")
        fields.append(Field(*parts))
    return tuple(fields)


FIELDS = parse_counters(COUNTERS_CSV)
METRICS = tuple(field for field in FIELDS if field.kind != "label")
