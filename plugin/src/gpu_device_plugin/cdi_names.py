"""CDI naming rules, shared by the settings check and the spec writer (no imports: no cycle)."""

from __future__ import annotations

import re

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
