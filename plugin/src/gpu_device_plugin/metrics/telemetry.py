"""Collectors, the Kubernetes step and a short cache: what /metrics and `metrics` ask for.

Sampled on scrape: nothing runs between scrapes, so an idle plugin stays idle with
telemetry on. The files and NVML handles are looked up on the first scrape and kept; the
values are read again on each, unless the last read is younger than `max_age` (two
Prometheus servers, or a scrape storm, cost one read). Who holds which GPU comes from
`pod_mapping`, which never makes a scrape wait on a stuck kubelet. Collectors are imported
and built on first use, so a plugin whose /metrics nobody scrapes never loads them.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

from ..config.settings import DEFAULT_RESOURCE, Settings
from ..model import Gpu
from ..observability.node import node_name
from . import attribution, exposition
from .collector import Collector, GpuSample, XidSource, no_xids
from .pod_mapping import Holders, NoKubelet, PodMapping, PodView

# both names our plugin can advertise (policy.resource_name: renameByDefault adds ".shared")
OUR_RESOURCES = (DEFAULT_RESOURCE, f"{DEFAULT_RESOURCE}.shared")
MAX_AGE_S = 1.0
LIST_TIMEOUT_S = 5.0  # one PodResources List, on its own thread: bounds how long a read stays in flight
UP = "gpu_device_plugin_pod_resources_up"
AGE = "gpu_device_plugin_pod_labels_age_seconds"

hostname = node_name  # dcgm-exporter's Hostname label: NODE_NAME when set, else the host's name


class Snapshot(NamedTuple):
    samples: list[GpuSample]
    holders: Holders  # GPU ID -> containers holding it, from the kubelet's last answer
    pods_error: str = ""  # why that answer may be stale: the kubelet's last read failed
    pods_age: float | None = None  # seconds since that answer; None: never had one


def make_collectors(gpus: Sequence[Gpu], host_root: str = "/", xids: XidSource = no_xids,
                    nvml_module: Any = None) -> list[Collector]:
    """A collector per kind of GPU present; simulated GPUs have no hardware to report."""
    collectors: list[Collector] = []
    backends = {gpu.backend for gpu in gpus}
    if "nvml" in backends:
        from .nvml import NvmlCollector

        collectors.append(NvmlCollector(gpus, nvml_module, xids))
    if "tegra" in backends:
        from .tegra import TegraCollector

        collectors.append(TegraCollector(gpus, host_root, xids, nvml_module))
    return collectors


HolderMapper = Callable[[Sequence[Any]], Holders]  # PodResources' pods -> GPU ID -> holders


def kubelet_holders(socket_path: str, mappers: Sequence[HolderMapper], timeout: float = LIST_TIMEOUT_S) -> Holders:
    """One PodResources List, mapped by each source of holders (the device plugin's devices; a DRA
    driver's claims) and merged; NoKubelet when nothing serves the socket."""
    from .podresources import list_pods

    pods = list_pods(socket_path, timeout)
    if pods is None:
        raise NoKubelet(f"no PodResources socket at {socket_path} (no kubelet yet)")
    return attribution.merge(*(mapper(pods) for mapper in mappers))


def device_plugin_mapper(resources: Collection[str], gpu_ids: Collection[str]) -> HolderMapper:
    """Our device plugin's devices (whole GPUs and time-slicing replicas) among the pods' devices."""
    return functools.partial(attribution.holders_by_gpu, resources=set(resources), gpu_ids=set(gpu_ids))


def pod_status_lines(view: PodView, node: str) -> list[str]:
    """How fresh the pod labels are: the kubelet answering or not, and the age of its last answer."""
    label = f'{{Hostname="{exposition.escape(node)}"}}'
    lines = [f"# HELP {UP} 1 when the kubelet's last PodResources List answered; 0 while pod labels come from an "
             "older answer (or none).", f"# TYPE {UP} gauge", f"{UP}{label} {int(view.answering)}"]
    if view.age is not None:
        lines += [f"# HELP {AGE} Seconds since the kubelet gave the pod-to-GPU mapping the pod labels come from.",
                  f"# TYPE {AGE} gauge", f"{AGE}{label} {exposition.format_value(round(view.age, 3))}"]
    return lines


class Telemetry:
    def __init__(
        self,
        make: Callable[[], list[Collector]],
        gpu_ids: Collection[str],
        pod_resources_socket: str | None,
        *,
        resources: Collection[str] = OUR_RESOURCES,
        node: str | None = None,
        max_age: float = MAX_AGE_S,
        wait: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        read_holders: Callable[[], Holders] | None = None,
    ) -> None:
        self._make = make
        self._collectors: list[Collector] | None = None
        self._node = node
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()  # the collectors and the sample cache; never held across the kubelet
        self._last: tuple[float, list[GpuSample]] | None = None
        ids = set(gpu_ids)
        if read_holders is None and pod_resources_socket and ids:
            mappers = [device_plugin_mapper(resources, ids)]
            read_holders = functools.partial(kubelet_holders, pod_resources_socket, mappers)
        self._pods = None if read_holders is None else PodMapping(
            read_holders, max_age=max_age, clock=clock, **({} if wait is None else {"wait": wait}))

    @classmethod
    def for_plugin(cls, settings: Settings, gpus: Sequence[Gpu], monitor: object = None,
                   nvml_module: Any = None) -> Telemetry:
        """What the daemon serves: its GPUs, Xids from its health monitor, the kubelet beside its socket."""
        from .podresources import socket_beside

        xids = getattr(monitor, "last_xid", None) or no_xids
        return cls(lambda: make_collectors(gpus, settings.host_root, xids, nvml_module), [g.id for g in gpus],
                   socket_beside(settings.kubelet_socket))

    @property
    def node(self) -> str:
        if self._node is None:
            self._node = hostname()
        return self._node

    def samples(self) -> list[GpuSample]:
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last[0] < self._max_age:
                return self._last[1]
            if self._collectors is None:
                self._collectors = self._make()
            samples = [sample for collector in self._collectors for sample in collector.collect()]
            self._last = (self._clock(), samples)
            return samples

    def pods(self) -> PodView | None:
        """The kubelet's last mapping; None when there is none to ask (no socket, no GPU)."""
        return self._pods.view() if self._pods is not None else None

    def snapshot(self) -> Snapshot:
        samples = self.samples()
        # no series to label (simulated GPUs, NVML gone): no question to the kubelet
        view = self.pods() if samples else None
        if view is None:
            return Snapshot(samples, {})
        return Snapshot(samples, view.holders, view.error, view.age)

    def render(self) -> str:
        samples = self.samples()
        view = self.pods() if samples else None
        text = exposition.render(attribution.attribute(samples, view.holders if view else {}), self.node)
        if view is not None:
            text += "\n".join(pod_status_lines(view, self.node)) + "\n"
        return text

    def close(self) -> None:
        with self._lock:
            for collector in self._collectors or ():
                collector.close()
            self._collectors = None
            self._last = None
