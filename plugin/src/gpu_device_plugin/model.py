"""Plain values shared by every layer: what a GPU is and what state it is in.

Value types on the serve path are NamedTuples, not dataclasses: importing dataclasses and
building ~20 frozen ones cost about 20 ms of the plugin's start (bench/kubelet_bench.py),
a fifth of it; a NamedTuple class costs next to nothing.
"""

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})  # a shared default nobody can change


class Gpu(NamedTuple):
    """One physical GPU as discovery found it. Immutable: a rescan builds new ones."""

    id: str  # stable ID the kubelet sees (NVML UUID, "tegra-..." or "sim-N")
    index: int  # backend's index; what NVIDIA_VISIBLE_DEVICES takes with the index strategy
    name: str  # product name, e.g. "NVIDIA Tesla T4" or "Tegra X1 (T210)"
    backend: str  # "tegra" | "nvml" | "simulated"
    # host device nodes this GPU needs inside a container (absolute paths, as on the host)
    device_nodes: tuple[str, ...] = ()
    # nodes passed when they exist, which they may not yet: nvidia-uvm appears on the first
    # CUDA use, so Allocate looks (as it does for device_nodes) each time, not discovery once
    optional_nodes: tuple[str, ...] = ()
    numa_node: int | None = None
    memory_mib: int | None = None
    mig_enabled: bool = False  # MIG GPUs are reported but never handed out whole
    properties: Mapping[str, str] = NO_PROPERTIES  # chip, l4t, compute capability...

    def __hash__(self) -> int:  # properties is a dict; identity is the ID
        return hash(self.id)


class Health(NamedTuple):
    healthy: bool
    reason: str = ""


HEALTHY = Health(True)
