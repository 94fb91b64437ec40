"""Checks 2-3: what discovery finds (and advertises), and whether its device nodes work."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..config.settings import DEFAULT_RESOURCE, Settings
from ..core import policy
from ..discovery.base import DiscoveryError
from ..discovery.select import choose
from ..discovery.tegra import OPENRM
from ..health.tegra import check_device_node
from ..model import Gpu
from .host import host_path, short_list
from .report import FAIL, PASS, SKIP, WARN, Check


@dataclass(frozen=True)
class Discovered:
    strategy: str
    backend: str | None  # None: auto found no GPU backend
    reason: str  # choose()'s one line
    gpus: tuple[Gpu, ...] = ()
    error: str = ""  # DiscoveryError text
    resource: str = DEFAULT_RESOURCE
    advertised: int = 0  # devices the plugin would advertise (replicas included)


def evaluate_discovery(found: Discovered) -> Check:
    name = "discovery"
    if found.backend is None:
        # auto on a node without a GPU is legitimate; the plugin idles and registers nothing.
        return Check(name, WARN, f"{found.reason}; the plugin advertises no {found.resource}",
                     "if this node has an NVIDIA GPU, load its driver and see `gpu-device-plugin discover`; "
                     "a node without a GPU needs nothing")
    if found.error or not found.gpus:
        # the strategy named a backend, or auto's probe saw the hardware: finding nothing is a fault
        what = found.error or f"{found.backend}: discovery returned no usable GPU"
        return Check(name, FAIL, f"{found.reason}; {what}; pods requesting {found.resource} stay Pending "
                     f"(Insufficient {found.resource})",
                     "do what the error says, then confirm with `gpu-device-plugin discover` and restart "
                     "gpu-device-plugin.service")
    gpus = ", ".join(f"{g.name} ({g.id})" for g in found.gpus)
    detail = (f"{found.reason}; found {len(found.gpus)} GPU(s): {gpus}; "
              f"advertised as {found.resource} x {found.advertised}")
    if found.advertised == 0:
        return Check(name, WARN, detail + " (MIG-enabled GPUs are not handed out whole)",
                     "disable MIG on the GPU (nvidia-smi -mig 0) to hand it out whole")
    if found.resource != DEFAULT_RESOURCE:
        detail += f" (time-slicing renames it: pods must request {found.resource}, not {DEFAULT_RESOURCE})"
    return Check(name, PASS, detail)


def discover(settings: Settings) -> Discovered:
    """What the daemon would find at start, with the reason and any DiscoveryError text."""
    choice = choose(settings)
    resource = policy.resource_name(settings)
    if choice.backend is None:
        return Discovered(settings.device_discovery_strategy, None, choice.reason, resource=resource)
    try:
        gpus = tuple(choice.backend.discover())
        error = ""
    except DiscoveryError as exc:
        gpus, error = (), str(exc)
    return Discovered(settings.device_discovery_strategy, choice.backend.name, choice.reason, gpus, error,
                      resource, len(policy.advertised_devices(gpus, settings)))


def evaluate_device_nodes(backend: str | None, nodes: Sequence[str], problems: Sequence[str],
                          gpu_driver: str = "") -> Check:
    """`problems`: one line per node that is missing or does not open (from check_device_node);
    `gpu_driver`: the Tegra GPU's driver when it is not nvgpu ("openrm-l4t" on Thor)."""
    name = "device nodes"
    if backend == "simulated":
        return Check(name, SKIP, "simulated GPUs have no device nodes")
    if not nodes:
        return Check(name, SKIP, "no GPU discovered, so no device nodes to check")
    if problems:
        fix = ("Thor's GPU runs on the nvidia module (OpenRM): check `lsmod | grep nvidia`, `dmesg | grep NVRM` "
               "and the nodes' owner and mode (ls -l /dev/nvidia* /dev/nvmap); the plugin reports the GPU "
               "Unhealthy while a node is bad"
               if backend == "tegra" and gpu_driver == OPENRM else
               "load the GPU driver (modprobe nvgpu) and check the nodes' owner and mode (ls -l /dev/nvhost-* "
               "/dev/nvmap); the plugin reports the GPU Unhealthy while a node is bad"
               if backend == "tegra" else
               "check the NVIDIA driver with nvidia-smi and that /dev/nvidia* exist (nvidia-modprobe); the plugin "
               "reports the GPU Unhealthy while a node is bad")
        return Check(name, FAIL, "; ".join(problems), fix)
    how = ("control nodes opened, the others checked for presence and access only (opening them powers the GPU up)"
           if backend == "tegra" else "present and accessible")
    return Check(name, PASS, f"{len(nodes)} device node(s) ({short_list(list(nodes))}): {how}")


def device_node_problems(settings: Settings, gpus: Iterable[Gpu]) -> tuple[list[str], list[str]]:
    """(nodes checked, problems). Reuses the health monitor's rule: only Tegra control nodes are opened."""
    nodes = sorted({node for gpu in gpus for node in gpu.device_nodes})
    problems = [p for p in (check_device_node(host_path(settings, n), n) for n in nodes) if p is not None]
    return nodes, problems
