"""A discovered GPU as a ResourceSlice device (resource.k8s.io/v1 `Device`): its name, attributes,
capacity, sharing and taints. Pure: a Gpu and its health in, the API's JSON shape out.

Attribute names are those NVIDIA's DRA driver publishes where they mean the same (`type`, `uuid`,
`productName`, `brand`, `architecture`, `cudaComputeCapability`, `driverVersion`,
`cudaDriverVersion`, the standard `resource.kubernetes.io/pciBusID` and `numaNode`), with the same
value spellings (go-nvlib's brand and architecture names; versions as semver with leading zeros
dropped), so `device.attributes["gpu.meta-gpu-k8s.io"].cudaComputeCapability >= semver("8.7")`
reads as it would for theirs. Ours besides: `index` (the discovery index), `integrated` (a Jetson's
iGPU shares the CPU's memory), `extendedResource` (true where the node's allocation API is `both`:
the DeviceClass mapping `nvidia.com/gpu` onto DRA selects these), and on a Jetson `chip` (T210, T234,
T264), `l4tRelease` (version) and `model` (the board). An attribute whose value we do not know is
left out, not guessed (a selector reading it fails on that device, which the scheduler reports,
rather than matching a wrong one); string values are cut to the API's 64 bytes.

Capacity `memory` is the memory the GPU can address: a dGPU's own; on a Jetson the system's RAM,
shared with the CPU and every process on the board, so it is a budget the scheduler divides
between claims, not memory set aside for the GPU.
"""

import re
from typing import Any

from ..model import Gpu, Health

STANDARD_PREFIX = "resource.kubernetes.io/"
PCI_BUS_ID = STANDARD_PREFIX + "pciBusID"
NUMA_NODE = STANDARD_PREFIX + "numaNode"
UNHEALTHY_TAINT = "unhealthy"  # under the driver's domain: gpu.meta-gpu-k8s.io/unhealthy
MAX_LABEL_VALUE = 63
# resource.k8s.io's limit on a string or version attribute's value (DeviceAttributeMaxValueLength): a longer
# one makes the API server refuse the whole slice
MAX_VALUE_BYTES = 64

# go-nvlib's GetArchitectureAsString names, by CUDA compute capability (the major number decides but for
# Turing and Ada); Blackwell spans 10.x (data centre), 11.0 (Jetson Thor) and 12.x (RTX)
ARCHITECTURES = {3: "Kepler", 5: "Maxwell", 6: "Pascal", 7: "Volta", 8: "Ampere", 9: "Hopper",
                 10: "Blackwell", 11: "Blackwell", 12: "Blackwell"}
ARCHITECTURE_EXCEPTIONS = {(7, 5): "Turing", (8, 9): "Ada Lovelace"}
# NVML brand constant suffixes (discovery's `brand` property) -> go-nvlib's GetBrandAsString names
BRANDS = {"unknown": "Unknown", "quadro": "Quadro", "tesla": "Tesla", "nvs": "NVS", "grid": "Grid",
          "geforce": "GeForce", "titan": "Titan", "nvidia_vapps": "NvidiaVApps", "nvidia_vpc": "NvidiaVPC",
          "nvidia_vcs": "NvidiaVCS", "nvidia_vws": "NvidiaVWS", "nvidia_cloud_gaming": "NvidiaCloudGaming",
          "quadro_rtx": "QuadroRTX", "nvidia_rtx": "NvidiaRTX", "nvidia": "Nvidia", "geforce_rtx": "GeForceRTX",
          "titan_rtx": "TitanRTX"}


def device_name(gpu: Gpu) -> str:
    """The device's name in the pool: `gpu-<index>` (a DNS label, stable across restarts like the index)."""
    return f"gpu-{gpu.index}"


def semver(text: str) -> str:
    """A version as Kubernetes' version attributes take it (strict semver 2.0): "8.7" -> "8.7.0",
    "580.95.05" -> "580.95.5", "R36.5.0" -> "36.5.0"; "" when it is not a version."""
    match = re.fullmatch(r"[Rr]?(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    if not match:
        return ""
    return ".".join(str(int(part or 0)) for part in match.groups())


def architecture(compute_capability: str) -> str:
    match = re.fullmatch(r"(\d+)\.(\d+)", compute_capability)
    if not match:
        return ""
    major, minor = int(match.group(1)), int(match.group(2))
    return ARCHITECTURE_EXCEPTIONS.get((major, minor)) or ARCHITECTURES.get(major, "")


def mebibytes(mib: int) -> str:
    """A quantity in MiB in the canonical form the API server stores (the largest binary suffix that
    divides it: 16384Mi is "16Gi"), so what we write reads back unchanged."""
    value, suffixes = mib, ["Mi", "Gi", "Ti", "Pi", "Ei"]
    while value and value % 1024 == 0 and len(suffixes) > 1:
        value //= 1024
        suffixes.pop(0)
    return f"{value}{suffixes[0]}"


def label_value(text: str) -> str:
    """`text` as a valid label value (what a taint's value must be): <= 63 of [A-Za-z0-9-_.]."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text.strip())[:MAX_LABEL_VALUE]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def fit(text: str) -> str:
    """`text` cut to the API's 64 bytes (whole UTF-8 characters): "NVIDIA Jetson Orin Nano Engineering
    Reference Developer Kit Super" is 65; a selector on such a value uses startsWith."""
    data = text.encode()
    return text if len(data) <= MAX_VALUE_BYTES else data[:MAX_VALUE_BYTES].decode(errors="ignore")


def attributes(gpu: Gpu, extended_resource: bool = False) -> dict[str, dict[str, Any]]:
    props = gpu.properties
    integrated = gpu.backend == "tegra"
    out: dict[str, dict[str, Any]] = {
        "type": {"string": "gpu"},
        "index": {"int": gpu.index},
        "productName": {"string": fit(gpu.name)},
        "integrated": {"bool": integrated},
        "extendedResource": {"bool": extended_resource},
    }
    uuid = gpu.id if gpu.backend == "nvml" else props.get("uuid", "")
    strings = {"uuid": uuid, "brand": BRANDS.get(props.get("brand", ""), ""),
               "architecture": architecture(props.get("compute_capability", ""))}
    versions = {"cudaComputeCapability": props.get("compute_capability", ""),
                "driverVersion": props.get("driver_version", ""),
                "cudaDriverVersion": props.get("cuda_driver_version", "")}
    if integrated:
        strings.update(chip=props.get("chip", ""), model=props.get("model", ""))
        versions["l4tRelease"] = props.get("l4t", "")
    out.update({key: {"string": fit(value)} for key, value in strings.items() if value})
    out.update({key: {"version": semver(value)} for key, value in versions.items() if semver(value)})
    if props.get("pci_bus_id"):
        out[PCI_BUS_ID] = {"string": fit(props["pci_bus_id"])}
    if gpu.numa_node is not None:
        out[NUMA_NODE] = {"int": gpu.numa_node}
    return out


def shares_allowed(gpu: Gpu, mode: str) -> bool:
    """Whether the device is published for more than one allocation (`--multiple-allocations`)."""
    return mode == "on" or (mode == "auto" and gpu.backend == "tegra")


def device(gpu: Gpu, driver: str, health: Health, shares: bool, taint_effect: str,
           extended_resource: bool = False) -> dict[str, Any]:
    """The ResourceSlice device for `gpu`. An unhealthy GPU carries the taint `<driver>/unhealthy`
    (value: why, as a label value); with `shares`, several claims can be given the GPU, each taking
    a part of its memory capacity (DRAConsumableCapacity): a claim that asks for no amount takes all
    of it, so a plain claim still has the GPU to itself."""
    out: dict[str, Any] = {"name": device_name(gpu), "attributes": attributes(gpu, extended_resource)}
    if gpu.memory_mib:
        memory: dict[str, Any] = {"value": mebibytes(gpu.memory_mib)}
        if shares:
            memory["requestPolicy"] = {"default": mebibytes(gpu.memory_mib)}
        out["capacity"] = {"memory": memory}
    if shares:
        out["allowMultipleAllocations"] = True
    if not health.healthy:
        out["taints"] = [{"key": f"{driver}/{UNHEALTHY_TAINT}", "value": label_value(health.reason) or "unhealthy",
                          "effect": taint_effect}]
    return out


def publishable(gpus: list[Gpu]) -> tuple[list[Gpu], list[str]]:
    """The GPUs a slice can offer whole, and one line for each left out (MIG: not carried by this driver)."""
    kept = [g for g in gpus if not g.mig_enabled]
    left = [f"GPU {g.index} ({g.id}) has MIG enabled: this driver hands out whole GPUs only and does not "
            "publish MIG devices; disable MIG (nvidia-smi -i N -mig 0) to publish it" for g in gpus if g.mig_enabled]
    return kept, left
