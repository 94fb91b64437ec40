"""`gpu-device-plugin metrics`: the values /metrics would serve, for a person on the board.

The same discovery and collectors as the plugin, read once; the containers holding each GPU
when the kubelet's PodResources socket answers. Xid errors are what the running plugin's
health monitor saw, so only its /metrics has them.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence

from . import fields
from .attribution import Holder, attribute
from .collector import GpuSample
from .exposition import format_value

_UNIT = r"\(in ([^)]+)\)"


def unit(field: fields.Field) -> str:
    found = re.search(_UNIT, field.help)
    return found.group(1) if found else ""


def shares(sample: GpuSample, holders: Mapping[str, Sequence[Holder]]) -> list[tuple[Holder, float]]:
    [gpu] = attribute([sample], holders)
    return [(share.holder, share.fraction) for share in gpu.shares]


def format_table(samples: Sequence[GpuSample], holders: Mapping[str, Sequence[Holder]], node: str,
                 pods_error: str = "", pods_age: float | None = None) -> str:
    lines = []
    width = max(len(field.name) for field in fields.METRICS)
    for sample in samples:
        labels = sample.labels
        extra = "".join(f"  {name} {value}" for name, value in (("pci", labels.pci_bus_id),
                                                                 ("driver", labels.driver_version)) if value)
        lines.append(f"GPU {labels.gpu}  {labels.model_name}  {labels.uuid}{extra}  node {node}")
        missing = []
        for field in fields.METRICS:
            if field.name in sample.values:
                shown = f"{format_value(sample.values[field.name])} {unit(field)}".rstrip()
                lines.append(f"  {field.name:<{width}}  {shown}")
            elif field.name != fields.XID_ERRORS:
                missing.append(field.name)
        if missing:
            lines += textwrap.wrap(f"not available on this GPU: {', '.join(missing)}", 100,
                                   initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
        held = [f"{h.namespace}/{h.pod} ({h.container}{', replica ' + h.vgpu if h.vgpu else ''}"
                f"{'' if fraction == 1 else f', share {fraction:.3g}'})" for h, fraction in shares(sample, holders)]
        lines.append(f"  held by: {', '.join(held)}" if held else "  held by: no container")
    if pods_error:
        since = f"the kubelet's answer of {pods_age:.0f} s ago" if pods_age is not None else "none"
        lines.append(f"pod labels: {since} (the kubelet did not answer now: {pods_error})")
    lines.append(f"{fields.XID_ERRORS}: only the running plugin's /metrics has it (its health monitor sees the Xids)")
    return "\n".join(lines)
