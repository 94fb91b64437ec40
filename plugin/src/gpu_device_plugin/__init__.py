"""GPU device plugin for the kubelet: Jetson (Tegra), NVML and simulated GPUs."""

__version__ = "0.1.0"
