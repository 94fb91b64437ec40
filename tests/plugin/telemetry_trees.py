"""The telemetry fixture trees (fixtures/telemetry/, README there) and the GPU the plugin serves on each."""

from __future__ import annotations

from pathlib import Path

from gpu_device_plugin.discovery.tegra import CHIP_NAMES, TegraBackend
from gpu_device_plugin.model import Gpu

TREES = Path(__file__).parent / "fixtures" / "telemetry"
NANO = TREES / "jetson-nano-r32"  # Jetson Nano devkit, L4T R32.7.6 (kirkstone)
ORIN = TREES / "jetson-orin-nano-r39"  # Jetson Orin Nano devkit (Super), L4T R39.2 (wrynose)
THOR = TREES / "jetson-agx-thor-r39"  # Jetson AGX Thor devkit, L4T R39.2 (wrynose)


def jetson_gpu(root: Path) -> Gpu:
    """The GPU the plugin serves on this tree. Thor's nodes are /dev/nvidia*, which discovery on
    this branch does not take yet (the Thor work's): telemetry needs only its ID, name and L4T."""
    backend = TegraBackend(str(root))
    if root != THOR:
        return backend.discover()[0]
    chip, _ = backend.chip()
    return Gpu(id=f"tegra-{chip.lower()}-igpu0", index=0, name=CHIP_NAMES[chip], backend="tegra",
               properties={"chip": chip, "l4t": backend.l4t_release()})
