"""The telemetry fixture trees (fixtures/telemetry/, README there) and the GPU the plugin serves on each."""

from __future__ import annotations

from pathlib import Path

from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.model import Gpu

TREES = Path(__file__).parent / "fixtures" / "telemetry"
NANO = TREES / "jetson-nano-r32"  # Jetson Nano devkit, L4T R32.7.6 (kirkstone)
ORIN = TREES / "jetson-orin-nano-r39"  # Jetson Orin Nano devkit (Super), L4T R39.2 (wrynose)
THOR = TREES / "jetson-agx-thor-r39"  # Jetson AGX Thor devkit, L4T R39.2 (wrynose)


def jetson_gpu(root: Path) -> Gpu:
    """The GPU the plugin's discovery serves on this tree."""
    [gpu] = TegraBackend(str(root)).discover()
    return gpu
