"""Whether an NVSwitch system's NVLink fabric is up, for its GPUs' health.

On an NVSwitch board (HGX/DGX A100, H100, H200) CUDA fails with 802, "system not yet
initialized", until NVIDIA Fabric Manager has set the fabric up; NVML and the kernel see the
GPUs all along, so without this check they are advertised healthy while every CUDA program
on them fails. Two signs, either one is enough:
- Fabric Manager (`nv-fabricmanager`) not running where nvidia.ko found an NVSwitch
  (/proc/driver/nvidia-nvswitch/devices/*, the condition its unit starts on);
- the GPU's fabric state not complete (nvmlDeviceGetGpuFabricInfoV: Hopper and newer; A100
  answers "not supported" and relies on the first sign).
A board without an NVSwitch is never affected.
"""

from __future__ import annotations

import os
from typing import Any

from ..discovery.nvml_lib import is_nvml_error
from .rules import GOOD, Observation, bad

NVSWITCH_DEVICES = "/proc/driver/nvidia-nvswitch/devices"
FABRICMANAGER = "nv-fabricmanager"
FABRICMANAGER_COMM = FABRICMANAGER[:15]  # /proc/<pid>/comm holds at most 15 characters

# nvmlGpuFabricState_t (nvml.h; nvidia-ml-py's NVML_GPU_FABRIC_STATE_*)
STATE_NOT_SUPPORTED = 0
STATE_NOT_STARTED = 1
STATE_IN_PROGRESS = 2
STATE_COMPLETED = 3
STATE_NAMES = {STATE_NOT_STARTED: "not started", STATE_IN_PROGRESS: "in progress"}
NVML_SUCCESS = 0
CUDA_802 = "CUDA fails with 802 (system not yet initialized) on it"


def nvswitches(root: str) -> list[str]:
    """The NVSwitches nvidia.ko found (empty on every other board)."""
    try:
        return sorted(os.listdir(os.path.join(root, NVSWITCH_DEVICES.lstrip("/"))))
    except OSError:
        return []


def _comm(root: str, pid: str) -> str:
    try:
        with open(os.path.join(root, "proc", pid, "comm"), encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


class FabricManagerWatch:
    """Is nv-fabricmanager running? Remembers its pid, so a check reads one file while it runs and
    scans /proc only to find it again."""

    def __init__(self, root: str = "/") -> None:
        self._root = root
        self._pid = ""

    def running(self) -> bool:
        if self._pid and _comm(self._root, self._pid) == FABRICMANAGER_COMM:
            return True
        self._pid = ""
        try:
            pids = [p for p in os.listdir(os.path.join(self._root, "proc")) if p.isdigit()]
        except OSError:
            return False
        for pid in pids:
            if _comm(self._root, pid) == FABRICMANAGER_COMM:
                self._pid = pid
                return True
        return False


def fabric_state(nvml: Any, handle: Any) -> tuple[int, int] | None:
    """(state, status) of the GPU in the NVLink fabric, or None when it reports none (pre-Hopper, an NVML
    without the call, or no fabric)."""
    import ctypes  # pynvml loaded it already; only NVSwitch boards get here

    try:
        if hasattr(nvml, "nvmlDeviceGetGpuFabricInfoV"):
            info = nvml.c_nvmlGpuFabricInfoV_t()
            nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        elif hasattr(nvml, "nvmlDeviceGetGpuFabricInfo"):
            info = nvml.c_nvmlGpuFabricInfo_t()
            nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        else:
            return None
    except Exception as exc:
        if is_nvml_error(nvml, exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
            return None
        raise
    if int(info.state) == STATE_NOT_SUPPORTED:
        return None
    return int(info.state), int(info.status)


def classify(fabric_manager_running: bool, state: tuple[int, int] | None) -> Observation:
    """One GPU of an NVSwitch board: healthy only with Fabric Manager running and its fabric set up."""
    if not fabric_manager_running:
        return bad(f"NVIDIA Fabric Manager is not running on this NVSwitch system: {CUDA_802} until it is "
                   "(systemctl status nvidia-fabricmanager)")
    if state is not None:
        fabric, status = state
        if fabric != STATE_COMPLETED:
            return bad(f"its NVLink fabric is {STATE_NAMES.get(fabric, f'in state {fabric}')}: {CUDA_802} until "
                       "Fabric Manager has set it up")
        if status != NVML_SUCCESS:
            return bad(f"its NVLink fabric failed to come up (NVML status {status}): {CUDA_802}")
    return GOOD
