"""Plain values shared by every layer: what a GPU is and what state it is in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gpu:
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
    properties: Mapping[str, str] = field(default_factory=dict)  # chip, l4t, compute capability...

    def __hash__(self) -> int:  # properties is a dict; identity is the ID
        return hash(self.id)


@dataclass(frozen=True)
class Health:
    healthy: bool
    reason: str = ""


HEALTHY = Health(True)
