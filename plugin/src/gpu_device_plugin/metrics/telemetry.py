"""Collectors, the Kubernetes step and a short cache: what /metrics and `metrics` ask for.

Sampled on scrape: nothing runs between scrapes, so an idle plugin stays idle with
telemetry on. The files and NVML handles are looked up on the first scrape and kept; the
values are read again on each, unless the last read is younger than `max_age` (two
Prometheus servers, or a scrape storm, cost one read). Collectors are imported and built on
first use, so a plugin whose /metrics nobody scrapes never loads them.
"""

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

from ..config.settings import DEFAULT_RESOURCE, Settings
from ..model import Gpu
from . import attribution, exposition
from .collector import Collector, GpuSample, XidSource, no_xids

log = logging.getLogger(__name__)

# both names our plugin can advertise (policy.resource_name: renameByDefault adds ".shared")
OUR_RESOURCES = (DEFAULT_RESOURCE, f"{DEFAULT_RESOURCE}.shared")
MAX_AGE_S = 1.0


class Snapshot(NamedTuple):
    samples: list[GpuSample]
    holders: dict[str, list[attribution.Holder]]  # GPU ID -> containers holding it
    pods_error: str = ""  # why pod labels are missing, when the kubelet did not answer


def hostname(environ: dict[str, str] | None = None) -> str:
    """dcgm-exporter's Hostname label: NODE_NAME when set, else the host's name."""
    environ = os.environ if environ is None else environ
    return environ.get("NODE_NAME") or socket.gethostname()


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

        collectors.append(TegraCollector(gpus, host_root, xids))
    return collectors


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make
        self._collectors: list[Collector] | None = None
        self._gpu_ids = set(gpu_ids)
        self._socket = pod_resources_socket
        self._resources = set(resources)
        self._node = node
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()  # one read at a time: concurrent scrapes share it
        self._last: tuple[float, Snapshot] | None = None
        self._pods_error = ""

    @classmethod
    def for_plugin(cls, settings: Settings, gpus: Sequence[Gpu], monitor: object = None,
                   nvml_module: Any = None) -> "Telemetry":
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

    def snapshot(self) -> Snapshot:
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last[0] < self._max_age:
                return self._last[1]
            if self._collectors is None:
                self._collectors = self._make()
            samples = [sample for collector in self._collectors for sample in collector.collect()]
            # no series to label (simulated GPUs, NVML gone): no question to the kubelet
            snapshot = Snapshot(samples, self._holders() if samples else {}, self._pods_error)
            self._last = (self._clock(), snapshot)
            return snapshot

    def _holders(self) -> dict[str, list[attribution.Holder]]:
        if not self._socket or not self._gpu_ids:
            return {}
        from .podresources import PodResourcesError, list_pods

        try:
            pods = list_pods(self._socket)
        except PodResourcesError as exc:
            if str(exc) != self._pods_error:  # once per new failure, not per scrape
                log.warning("GPU metrics without pod labels: the kubelet's PodResources service did not "
                            "answer (%s)", exc)
            self._pods_error = str(exc)
            return {}
        if self._pods_error:
            log.info("the kubelet's PodResources service answers again: GPU metrics carry pod labels")
            self._pods_error = ""
        return attribution.holders_by_gpu(pods or (), self._resources, self._gpu_ids)

    def render(self) -> str:
        snapshot = self.snapshot()
        return exposition.render(snapshot.samples, snapshot.holders, self.node)

    def close(self) -> None:
        with self._lock:
            for collector in self._collectors or ():
                collector.close()
            self._collectors = None
            self._last = None
