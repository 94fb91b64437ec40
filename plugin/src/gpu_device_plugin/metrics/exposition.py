"""The Prometheus text of GPU samples, labelled as dcgm-exporter labels them: pure.

Series look like dcgm-exporter's:
    DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-...",pci_bus_id="00000000:3B:00.0",device="nvidia0",
        modelName="NVIDIA A100-SXM4-40GB",Hostname="node1",DCGM_FI_DRIVER_VERSION="580.105.08",
        container="main",namespace="default",pod="train-0"} 87
with the same label names and order (its template's fixed labels, then the label fields,
then the attributes sorted by name). A label with no value (pci_bus_id on a Jetson's
platform GPU) is left out, which Prometheus reads the same. dcgm-exporter's own main branch
renamed Hostname to hostname after its last release; we follow the releases (and the
dashboards written for them).

One series per GPU and field, whole (attribution.py says when it names a pod); beside them
`gpu_device_plugin_pod_gpu_share`, one series per device ID a container holds, with the
GPU's labels and the holder's, so `DCGM_* * on (Hostname, UUID) group_right share` splits
any field by pod without counting a GPU twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import fields, xids
from .attribution import Attributed
from .collector import GpuSample

SHARE = "gpu_device_plugin_pod_gpu_share"
SHARE_HELP = ("Share of the GPU the container holds: 1 for a whole GPU; a time-sliced GPU's held replicas "
              "split evenly. An allocation, not a measurement: DCGM_* x share attributes a GPU's value per pod.")


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


def field_attributes(field: str, value: float) -> dict[str, str]:
    """The Xid's code and meaning on DCGM_FI_DEV_XID_ERRORS, as dcgm-exporter writes them."""
    if field != fields.XID_ERRORS:
        return {}
    return {"err_code": format_value(value), "err_msg": xids.meaning(int(value))}


def render(gpus: Sequence[Attributed], hostname: str) -> str:
    """Every field some GPU has a value for, HELP and TYPE once, one series per GPU; then the
    pod shares of the GPUs containers hold."""
    lines: list[str] = []
    bases = [base_labels(gpu.sample, hostname) for gpu in gpus]
    for field in fields.METRICS:
        rows: list[str] = []
        for gpu, base in zip(gpus, bases, strict=True):
            if field.name not in gpu.sample.values:
                continue
            number = gpu.sample.values[field.name]
            attributes = {**field_attributes(field.name, number),
                          **(gpu.owner.attributes(with_vgpu=False) if gpu.owner is not None else {})}
            rows.append(series(field.name, base + sorted(attributes.items()), format_value(number)))
        if rows:
            lines += [f"# HELP {field.name} {field.help}", f"# TYPE {field.name} {field.kind}", *rows]
    shares = [series(SHARE, base + sorted(share.holder.attributes().items()), format_value(share.fraction))
              for gpu, base in zip(gpus, bases, strict=True) for share in gpu.shares]
    if shares:
        lines += [f"# HELP {SHARE} {SHARE_HELP}", f"# TYPE {SHARE} gauge", *shares]
    return "\n".join(lines) + "\n" if lines else ""
