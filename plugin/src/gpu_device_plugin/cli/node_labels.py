"""Node labels from discovery, as a k3s config drop-in (`/etc/rancher/k3s/config.yaml.d/`).

Written at boot before k3s starts, so a node is labelled with the GPU it really has (and not
labelled at all without one). Label names follow NVIDIA's GPU feature discovery where they
overlap (gpu.present, gpu.count, gpu.product, gpu.family, gpu.memory, gpu.compute.major/minor,
cuda.driver-version.* and cuda.runtime-version.* with their older cuda.driver.* / cuda.runtime.*
spellings). Jetsons add gpu.chip, gpu.l4t and gpu.power-mode, which feature discovery lacks; a
Thor also carries the cuda.driver-version.* of its OpenRM driver (595.78 on R39.2).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Sequence

from ..model import Gpu

PREFIX = "nvidia.com/"
MAX_LABEL_VALUE = 63
# CUDA compute capability -> architecture family (the major number decides, except where noted):
# Blackwell spans 10.x (data centre), 11.0 (Jetson Thor's GB10B) and 12.x (RTX)
FAMILIES = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 7: "volta", 8: "ampere",
            9: "hopper", 10: "blackwell", 11: "blackwell", 12: "blackwell"}
FAMILY_EXCEPTIONS = {(7, 5): "turing", (8, 9): "ada-lovelace"}


def label_value(text: str) -> str:
    """`text` as a valid Kubernetes label value: <= 63 of [A-Za-z0-9-_.], alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text.strip())
    value = re.sub(r"-{2,}", "-", value)[:MAX_LABEL_VALUE]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def family(major: int, minor: int) -> str:
    return FAMILY_EXCEPTIONS.get((major, minor)) or FAMILIES.get(major, "")


def gpu_labels(gpus: Sequence[Gpu], backend: str) -> dict[str, str]:
    """Labels for a node with `gpus` (none: no labels). The lowest-index GPU names the product."""
    if not gpus:
        return {}
    first = min(gpus, key=lambda g: (g.index, g.id))
    labels = {
        "gpu.present": "true",
        "gpu.count": str(len(gpus)),
        "gpu.product": label_value(first.name),
        "gpu.discovery": label_value(backend),
    }
    match = re.fullmatch(r"(\d+)\.(\d+)", first.properties.get("compute_capability", ""))
    if match:
        major, minor = int(match.group(1)), int(match.group(2))
        labels["gpu.compute.major"] = str(major)
        labels["gpu.compute.minor"] = str(minor)
        if family(major, minor):
            labels["gpu.family"] = family(major, minor)
    if first.memory_mib:
        labels["gpu.memory"] = str(first.memory_mib)
    labels.update(version_labels("cuda.driver", first.properties.get("driver_version", ""), 3))
    labels.update(version_labels("cuda.runtime", first.properties.get("cuda_driver_version", ""), 2))
    if first.backend == "tegra":
        # the same keys on every Jetson, Nano (R32) to Orin (R36, R39) and Thor (R39)
        for key, prop in (("gpu.chip", "chip"), ("gpu.l4t", "l4t"), ("gpu.power-mode", "power_mode")):
            if first.properties.get(prop):
                labels[key] = label_value(first.properties[prop])
    return {PREFIX + key: value for key, value in labels.items() if value}


def version_labels(name: str, version: str, parts: int) -> dict[str, str]:
    """GPU feature discovery's version labels: `<name>-version.full/major/minor[/revision]` and the
    older `<name>.major/minor[/rev]` that existing selectors still use. Nothing for a malformed version."""
    if not re.fullmatch(r"\d+(\.\d+){1,2}", version):
        return {}
    numbers = version.split(".") + [""] * 3
    out = {f"{name}-version.full": version}
    for key, old, value in zip(("major", "minor", "revision")[:parts], ("major", "minor", "rev")[:parts],
                               numbers, strict=False):
        if value:
            out[f"{name}-version.{key}"] = value
            out[f"{name}.{old}"] = value
    return out


def drop_in(labels: dict[str, str]) -> str:
    """The k3s config drop-in. `node-label+` appends to labels set in config.yaml instead of
    replacing them (k3s merges config.yaml.d this way since v1.21)."""
    lines = ["# Written at boot by `gpu-device-plugin node-labels` from GPU discovery; edits are lost.",
             "node-label+:"]
    lines += [f'  - "{key}={value}"' for key, value in sorted(labels.items())]
    return "\n".join(lines) + "\n"


def write_atomically(path: str, text: str) -> None:
    """Replace `path` in one step: k3s never reads half a file, a crash leaves the old one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".node-labels-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove(path: str) -> bool:
    """Remove the drop-in (no GPU: no labels); True when there was one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
