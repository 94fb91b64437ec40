"""Loading pynvml, starting and stopping it, reading its errors: shared by discovery and health.

pynvml is imported lazily (Jetson images carry no NVML); tests inject a fake module.
"""

from __future__ import annotations

import logging
from typing import Any

from .base import DiscoveryError

log = logging.getLogger(__name__)

# NVML error codes (nvml.h); read from the module when it has them, these are the fallback.
_ERROR_CODES = {
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
}

_LIBRARY_MISSING = (
    "NVML library libnvidia-ml.so.1 not found: install the NVIDIA driver, or run the plugin where "
    "the driver is visible (host service, or the nvidia runtime)"
)


def error_code(nvml: Any, name: str) -> int:
    return int(getattr(nvml, name, _ERROR_CODES[name]))


def is_nvml_error(nvml: Any, exc: BaseException, *names: str) -> bool:
    """Whether `exc` is an NVMLError carrying one of the named codes (any code if none named)."""
    base = getattr(nvml, "NVMLError", None)
    if base is None or not isinstance(exc, base):
        return False
    if not names:
        return True
    return getattr(exc, "value", None) in {error_code(nvml, n) for n in names}


def load_nvml(nvml_module: Any = None) -> Any:
    """The pynvml module (or the injected one); DiscoveryError naming the fix when absent."""
    if nvml_module is not None:
        return nvml_module
    try:
        import pynvml
    except ImportError:
        raise DiscoveryError(
            "Python module pynvml (nvidia-ml-py) is not installed: install nvidia-ml-py, "
            "or choose another discovery backend (tegra, simulated)"
        ) from None
    return pynvml


def init_error_message(nvml: Any, exc: BaseException) -> str:
    """One line: what kept NVML from starting, and the usual fix."""
    if is_nvml_error(nvml, exc, "NVML_ERROR_LIBRARY_NOT_FOUND") or isinstance(exc, OSError):
        return _LIBRARY_MISSING
    if is_nvml_error(nvml, exc, "NVML_ERROR_DRIVER_NOT_LOADED"):
        return (
            "NVIDIA kernel driver is not loaded (NVML: Driver Not Loaded): load it (modprobe nvidia) "
            "and check that the driver was built for the running kernel"
        )
    if is_nvml_error(nvml, exc, "NVML_ERROR_NO_PERMISSION"):
        return (
            "no permission to use NVML (Insufficient Permissions): run the plugin as root, or give it "
            "access to /dev/nvidiactl and /dev/nvidia*"
        )
    if is_nvml_error(nvml, exc, "NVML_ERROR_LIB_RM_VERSION_MISMATCH"):
        return (
            "NVML library and NVIDIA kernel driver versions differ: reboot after a driver upgrade, "
            "or reinstall the driver so both match"
        )
    return (
        f"NVML failed to initialise ({exc}): check `nvidia-smi` on the host; "
        "the driver or a GPU may be broken"
    )


def nvml_init(nvml: Any) -> None:
    """nvmlInit, with any failure turned into a DiscoveryError with a fix-it message."""
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses, or OSError from ctypes
        raise DiscoveryError(init_error_message(nvml, exc)) from exc


def nvml_shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception as exc:
        log.debug("nvmlShutdown failed: %s", exc)


def text(value: Any) -> str:
    """pynvml returns str on Python 3 in new releases, bytes in older ones and in ctypes fields."""
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)
