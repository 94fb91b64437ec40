"""CDI naming rules, shared by the settings check and the spec writer (no imports: no cycle)."""

from __future__ import annotations

import re
from collections.abc import Collection

# the kind of the NVIDIA Container Toolkit's generated spec (nvidia-ctk cdi generate's default vendor/class)
TOOLKIT_KIND = "nvidia.com/gpu"

# The CDI parser's rules (tags.cncf.io/container-device-interface/pkg/parser), as regexes.
DEVICE_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?"  # compiled on use (re caches)
_VENDOR_OR_CLASS = r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"


def split_kind(kind: str) -> tuple[str, str]:
    """'vendor.tld/class' -> (vendor, class); ValueError naming the rule it breaks."""
    vendor, sep, klass = kind.partition("/")
    if not sep or not re.fullmatch(_VENDOR_OR_CLASS, vendor) or not re.fullmatch(_VENDOR_OR_CLASS, klass):
        raise ValueError(
            f"CDI kind {kind!r} must be vendor/class, each starting with a letter, ending with a letter or "
            "digit, with only letters, digits, '_', '-' and '.' between (e.g. meta-gpu-k8s.io/gpu)"
        )
    return vendor, klass


def jetson_toolkit_name(names: Collection[str], index: int, uuid: str = "", id_strategy: str = "index") -> str:
    """The device a Jetson's iGPU goes by in the toolkit's spec (`names`: the spec's device names), or "".

    `nvidia-ctk cdi generate` on a Jetson runs in CSV mode (its auto mode takes an integrated GPU,
    "Orin (nvgpu)" or "NVIDIA Thor", to the Tegra platform): with one GPU it names it by index, "0",
    and "all". Thor also answers NVML, so with a second GPU (a dGPU beside the iGPU) CSV mode names
    each by index and UUID ("GPU-..."), as NVML mode (`--mode=nvml`) does; "all" is then both GPUs,
    so it stands for the iGPU only where it is the spec's one device.
    """
    wanted = [uuid, str(index)] if id_strategy == "uuid" else [str(index), uuid]
    found = next((name for name in wanted if name and name in names), "")
    if found:
        return found
    return "all" if set(names) == {"all"} else ""
