"""Discrete NVIDIA GPUs through NVML (nvidia-ml-py).

pynvml is imported lazily, inside probe/discover, so the plugin imports and runs on
machines without it (Jetson Nano images carry no NVML). Tests inject a fake module.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..model import Gpu
from .base import DiscoveryError, Probe
from .nvml_lib import is_nvml_error, load_nvml, nvml_init, nvml_shutdown, text

log = logging.getLogger(__name__)

# Device nodes of every container that uses a discrete GPU: the control node always, the
# others when the host has them (nvidia-uvm appears on the first CUDA use; Allocate looks).
CONTROL_NODE = "/dev/nvidiactl"
OPTIONAL_NODES = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")

def is_integrated_name(name: str) -> bool:
    """NVML's name for a Tegra iGPU (Orin: "Orin (nvgpu)", Thor: "NVIDIA Thor")."""
    return "(nvgpu)" in name or "NVIDIA Thor" in name


def sysfs_pci_address(bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" as sysfs names it: "0000:3b:00.0" (4 hex digits of domain at least)."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if not sep or not rest:
        return bus_id
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return bus_id


def cuda_version(nvml: Any) -> str:
    """The newest CUDA the driver supports ("13.0" from NVML's 13000), or "" when NVML cannot say."""
    fn = getattr(nvml, "nvmlSystemGetCudaDriverVersion", None)
    try:
        value = int(fn()) if fn is not None else 0
    except Exception:
        return ""
    return f"{value // 1000}.{value % 1000 // 10}" if value > 0 else ""


class NvmlBackend:
    """One Gpu per NVML device: ID = UUID, with its device nodes, NUMA node and properties."""

    name = "nvml"

    def __init__(self, root: str = "/", nvml_module: Any = None) -> None:
        self.root = root
        self._nvml_module = nvml_module

    def _host_path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def probe(self) -> Probe:
        try:
            return self._probe()
        except Exception as exc:  # probe never raises: a broken NVML is "not usable"
            return Probe(False, f"NVML probe failed: {exc}")

    def _probe(self) -> Probe:
        try:
            nvml = load_nvml(self._nvml_module)
            nvml_init(nvml)
        except DiscoveryError as exc:
            return Probe(False, str(exc))
        try:
            names = [
                text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(nvml.nvmlDeviceGetCount())
            ]
        finally:
            nvml_shutdown(nvml)
        evidence = tuple(
            f"nvml: GPU {i}: {n} ({'integrated' if is_integrated_name(n) else 'discrete'})"
            for i, n in enumerate(names)
        )
        if not names:
            return Probe(False, "NVML works but reports no GPUs", evidence)
        discrete = [n for n in names if not is_integrated_name(n)]
        if not discrete:
            # NVML on Orin answers names but little else; Thor's OpenRM answers more, but its memory
            # is the CPU's and the toolkit injects it in CSV mode: the tegra backend serves both.
            return Probe(
                False,
                f"NVML sees only the integrated GPU {names[0]}: the tegra backend serves it, as the "
                "NVIDIA Container Toolkit does (CSV mode for integrated GPUs)",
                evidence,
            )
        return Probe(True, f"NVML works and reports {len(discrete)} discrete GPU(s)", evidence)

    def discover(self) -> list[Gpu]:
        nvml = load_nvml(self._nvml_module)
        nvml_init(nvml)
        try:
            try:
                driver = text(nvml.nvmlSystemGetDriverVersion())
                count = nvml.nvmlDeviceGetCount()
                cuda = cuda_version(nvml)
            except Exception as exc:
                raise DiscoveryError(
                    f"NVML initialised but cannot list GPUs ({exc}): check `nvidia-smi` on the host"
                ) from exc
            gpus = []
            for index in range(count):
                try:
                    gpus.append(self._read_gpu(nvml, index, driver, cuda))
                except Exception as exc:
                    # One broken GPU must not hide the others; it stays out of the list.
                    log.warning("skipping GPU %d: NVML cannot read it (%s); check `nvidia-smi -i %d`",
                                index, exc, index)
            return gpus
        finally:
            nvml_shutdown(nvml)

    def _read_gpu(self, nvml: Any, index: int, driver: str, cuda: str = "") -> Gpu:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = text(nvml.nvmlDeviceGetUUID(handle))
        name = text(nvml.nvmlDeviceGetName(handle))
        memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)

        properties = {"driver_version": driver}
        if cuda:
            properties["cuda_driver_version"] = cuda
        pci_info = self._optional(nvml, "nvmlDeviceGetPciInfo", handle)
        pci_address = sysfs_pci_address(text(pci_info.busId)) if pci_info is not None else ""
        if pci_address:
            properties["pci_bus_id"] = pci_address
        capability = self._optional(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
        if capability is not None:
            properties["compute_capability"] = f"{capability[0]}.{capability[1]}"
        brand = self._optional(nvml, "nvmlDeviceGetBrand", handle)
        if brand is not None:
            properties["brand"] = self._brand_name(nvml, brand)

        nodes = []
        minor = self._optional(nvml, "nvmlDeviceGetMinorNumber", handle)
        if minor is not None:
            nodes.append(f"/dev/nvidia{minor}")
        nodes.append(CONTROL_NODE)

        mig = self._optional(nvml, "nvmlDeviceGetMigMode", handle)
        mig_enabled = mig is not None and int(mig[0]) == int(getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))

        return Gpu(
            id=uuid,
            index=index,
            name=name,
            backend=self.name,
            device_nodes=tuple(nodes),
            optional_nodes=OPTIONAL_NODES,
            numa_node=self._numa_node(nvml, handle, pci_address),
            memory_mib=memory_mib,
            mig_enabled=mig_enabled,
            properties=properties,
        )

    @staticmethod
    def _optional(nvml: Any, function: str, handle: Any) -> Any:
        """A query that old drivers, old nvidia-ml-py or some GPUs lack: None instead of an error."""
        fn = getattr(nvml, function, None)
        if fn is None:
            return None
        try:
            return fn(handle)
        except Exception as exc:
            if not is_nvml_error(nvml, exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                log.debug("%s failed: %s", function, exc)
            return None

    def _numa_node(self, nvml: Any, handle: Any, pci_address: str) -> int | None:
        node = self._optional(nvml, "nvmlDeviceGetNumaNodeId", handle)
        if node is None and pci_address:
            node = self._sysfs_numa_node(pci_address)
        if node is None or int(node) < 0:  # -1: the platform does not say (single-node machines)
            return None
        return int(node)

    def _sysfs_numa_node(self, pci_address: str) -> int | None:
        path = self._host_path(f"/sys/bus/pci/devices/{pci_address}/numa_node")
        try:
            with open(path) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _brand_name(nvml: Any, brand: int) -> str:
        for attr in dir(nvml):
            if attr.startswith("NVML_BRAND_") and attr != "NVML_BRAND_COUNT" and getattr(nvml, attr) == brand:
                return attr[len("NVML_BRAND_"):].lower()
        return str(brand)
