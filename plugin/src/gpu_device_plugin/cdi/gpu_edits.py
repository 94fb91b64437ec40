"""The container edits one GPU needs, exactly as the CDI spec that describes it gives them: the DRA
driver copies them into each claim's spec.

- A GPU the NVIDIA Container Toolkit's generated spec names (every NVML GPU; a Jetson whose toolkit
  generated a CSV-mode spec): that device's edits and the spec-wide edits (driver libraries,
  hooks, control nodes) of the same spec, as `nvidia-ctk cdi generate` wrote them.
- A Jetson without one: the spec the device plugin writes for it (its device nodes; the runtime's
  CSV files as spec-wide edits), built the same way here.
- A simulated GPU: its env edit.
An NVML GPU the toolkit's spec does not name has no source of its libraries: the caller is told
why, and refuses rather than start a container without its driver.
"""

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..config.settings import Settings
from ..host.paths import host_path_exists
from ..model import Gpu
from . import spec as own_spec
from .toolkit_spec import REGENERATE, ToolkitSpec, match_gpu


class GpuEdits(NamedTuple):
    device: Mapping[str, Any]  # the GPU's own containerEdits
    common: Mapping[str, Any]  # the spec-wide containerEdits that come with it
    cdi_version: str  # the source spec's cdiVersion: the claim's spec needs at least this
    source: str  # where they come from, for the log


def _owner(specs: Sequence[ToolkitSpec], name: str) -> ToolkitSpec:
    # later (higher priority) specs win, as in the CDI cache
    return [s for s in specs if name in s.devices][-1]


def gpu_edits(gpus: Sequence[Gpu], settings: Settings, specs: Sequence[ToolkitSpec]) -> dict[str, GpuEdits | str]:
    """For each GPU ID: its edits, or why there are none (a one-line fix-it message)."""
    out: dict[str, GpuEdits | str] = {}
    ours: dict[str, Any] | None = None
    for gpu in gpus:
        if gpu.backend in ("nvml", "tegra"):
            name, problem = match_gpu(gpu, specs, "uuid")
            if name:
                owner = _owner(specs, name)
                out[gpu.id] = GpuEdits(owner.device_edits.get(name, {}), owner.common_edits, owner.cdi_version,
                                       f"{owner.path} ({name})")
                continue
            if gpu.backend == "nvml":
                out[gpu.id] = (f"GPU {gpu.index} ({gpu.id}) is not in the NVIDIA Container Toolkit's CDI spec: "
                               f"{problem}; its driver libraries come only from that spec: {REGENERATE}")
                continue
        if ours is None:
            ours = _own_spec([g for g in gpus if g.backend != "nvml"], settings)
        device = next((d for d in ours["devices"] if d["name"] == str(gpu.index)), None)
        if device is None:
            out[gpu.id] = f"GPU {gpu.index} ({gpu.id}) cannot be described in a CDI spec"
            continue
        source = "the runtime's CSV files" if gpu.backend == "tegra" else "simulated"
        out[gpu.id] = GpuEdits(device["containerEdits"], ours.get("containerEdits", {}), ours["cdiVersion"], source)
    return out


def _own_spec(gpus: Sequence[Gpu], settings: Settings) -> dict[str, Any]:
    root = settings.host_root
    tegra = any(g.backend == "tegra" for g in gpus)
    return own_spec.build_spec(gpus, settings, own_spec.read_csv_files(root) if tegra else {},
                               exists=lambda p: host_path_exists(root, p),
                               alt_roots=own_spec.read_alt_roots(root) if tegra else [])
