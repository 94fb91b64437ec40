"""The contract every telemetry source keeps, and the values they hand over.

A collector knows one kind of hardware (NVML, Jetson sysfs) and nothing about Prometheus or
Kubernetes: it returns one GpuSample per GPU with the fields it could read now. A field it
cannot read (the hardware lacks it, the driver says "not supported", a file is missing or
unreadable) is left out of `values`, never filled in.
"""

from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

# The last Xid a health monitor saw on a GPU (0: none yet), or None when nothing watches
# for them there: the monitors see Xids, the collectors only report them.
XidSource = Callable[[str], "int | None"]


def no_xids(gpu_id: str) -> int | None:
    return None


class GpuLabels(NamedTuple):
    """What dcgm-exporter puts on every series of a GPU."""

    gpu: str  # the GPU's index
    uuid: str  # the ID the kubelet knows the GPU by (PodResources' device IDs join on it)
    device: str  # "nvidia<index>", as dcgm-exporter names it
    model_name: str
    pci_bus_id: str = ""  # NVML's form, "00000000:3B:00.0"; empty on a Jetson's platform GPU
    driver_version: str = ""  # DCGM_FI_DRIVER_VERSION


class GpuSample(NamedTuple):
    labels: GpuLabels
    values: Mapping[str, float]  # DCGM field name -> value, only for the fields read now


class Collector(Protocol):
    name: str

    def collect(self) -> list[GpuSample]:
        """One sample per GPU, read now. Never raises: a failing read leaves its field out."""
        ...

    def close(self) -> None:
        """Release what the collector holds (an NVML session); idempotent."""
        ...
