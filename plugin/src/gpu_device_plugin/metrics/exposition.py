"""The Prometheus text of GPU samples, labelled as dcgm-exporter labels them: pure.

Series look like dcgm-exporter's:
    DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-...",pci_bus_id="00000000:3B:00.0",device="nvidia0",
        modelName="NVIDIA A100-SXM4-40GB",Hostname="node1",DCGM_FI_DRIVER_VERSION="580.105.08",
        container="main",namespace="default",pod="train-0"} 87
with the same label names and order (its template's fixed labels, then the label fields,
then the attributes sorted by name). A label with no value (pci_bus_id on a Jetson's
platform GPU) is left out, which Prometheus reads as the same series. dcgm-exporter's own
main branch renamed Hostname to hostname after its last release; we follow the releases
(and the dashboards written for them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from . import fields
from .attribution import Holder
from .collector import GpuSample


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


def base_labels(sample: GpuSample, hostname: str) -> list[tuple[str, str]]:
    labels = sample.labels
    pairs = [("gpu", labels.gpu), ("UUID", labels.uuid), ("pci_bus_id", labels.pci_bus_id),
             ("device", labels.device), ("modelName", labels.model_name), ("Hostname", hostname),
             (fields.DRIVER_VERSION, labels.driver_version)]
    return [(name, value) for name, value in pairs if value]


def series(name: str, labels: Sequence[tuple[str, str]], value: str) -> str:
    inside = ",".join(f'{key}="{escape(text)}"' for key, text in labels)
    return f"{name}{{{inside}}} {value}"


def render(samples: Sequence[GpuSample], holders: Mapping[str, Sequence[Holder]], hostname: str) -> str:
    """Every field some GPU has a value for, HELP and TYPE once, a series per GPU, or per
    container holding it (`holders`: GPU ID -> containers)."""
    lines: list[str] = []
    bases = [base_labels(sample, hostname) for sample in samples]
    for field in fields.METRICS:
        rows: list[str] = []
        for sample, base in zip(samples, bases, strict=True):
            if field.name not in sample.values:
                continue
            value = format_value(sample.values[field.name])
            extra = {"err_code": value} if field.name == fields.XID_ERRORS else {}
            for holder in holders.get(sample.labels.uuid) or (None,):
                attributes = {**extra, **(holder.attributes() if holder is not None else {})}
                rows.append(series(field.name, base + sorted(attributes.items()), value))
        if rows:
            lines += [f"# HELP {field.name} {field.help}", f"# TYPE {field.name} {field.kind}", *rows]
    return "\n".join(lines) + "\n" if lines else ""
