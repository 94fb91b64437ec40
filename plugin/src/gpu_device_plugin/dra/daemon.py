"""One run of the DRA driver: serve the DRA socket, then the registration socket the kubelet's plugin
watcher finds, publish the node's ResourceSlices, follow GPU health, stop cleanly on SIGTERM.

One thread runs this loop; each gRPC server and the publisher have their own, the health monitor
reports from its own. The loop sleeps in select() on inotify (our two socket directories), a wake
pipe (signals, health) and the next timer (rediscovery). A socket of ours that is deleted is served
again at once (the kubelet's plugin watcher then registers us again). On SIGTERM both sockets are
removed and the ResourceSlices stay: a restart publishes the same, and a driver that stays away is
cleaned up by the kubelet, which wipes a driver's slices 30 s after it cannot reach it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..cdi.gpu_edits import GpuEdits, gpu_edits
from ..cdi.toolkit_spec import ToolkitSpecs
from ..config.settings import Settings
from ..health.base import HealthMonitor
from ..host import inotify
from ..model import HEALTHY, Gpu, Health
from ..observability import sdnotify
from ..session import signals
from . import attributes, claim_spec
from .checkpoint import Checkpoint
from .cluster import Cluster
from .prepare import Preparer, run_command
from .publisher import Publisher
from .service import HEALTH_RESEND_S, DeviceHealth, NodeService, Registration
from .settings import DraSettings
from .sockets import SocketServer

log = logging.getLogger(__name__)

REDISCOVER_S = 60.0
SERVE_RETRY_S = 1.0  # a GPU that appears (a driver loaded late, a hot-plug) is published within this
_DIR_EVENTS = inotify.IN_DELETE | inotify.IN_MOVED_FROM | inotify.IN_CREATE


class DraDaemon:
    def __init__(self, settings: Settings, dra: DraSettings, node: str, cluster: Cluster, gpus: Sequence[Gpu],
                 make_monitor: Callable[[Sequence[Gpu]], HealthMonitor | None] = lambda gpus: None,
                 rediscover: Callable[[], list[Gpu] | None] | None = None,
                 run: Callable[[list[str]], str] = run_command, environ: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.dra = dra
        self.node = node
        self.cluster = cluster
        self.make_monitor = make_monitor
        self.rediscover = rediscover
        self._environ = dict(os.environ) if environ is None else dict(environ)
        self._lock = threading.Lock()
        self.gpus, left_out = attributes.publishable(list(gpus))
        for line in left_out:
            log.warning("%s", line)
        self.health: dict[str, Health] = {g.id: HEALTHY for g in self.gpus}
        self.device_health = DeviceHealth(node)
        self.toolkit = ToolkitSpecs(settings.host_root)
        self.checkpoint = Checkpoint(dra.checkpoint_dir, dra.driver_name, node)
        self.preparer = Preparer(dra.driver_name, node, dra.cdi_dir, self.checkpoint, cluster.get_claim,
                                 lambda: list(self.gpus), self._edits, run)
        self.registration = Registration(dra.driver_name, dra.dra_socket)
        self.node_service = NodeService(self.preparer, self.device_health)
        self.dra_server = SocketServer(dra.dra_socket, self.node_service.methods())
        self.registration_server = SocketServer(dra.registration_socket, self.registration.methods())
        self.publisher = Publisher(cluster, self.slice_devices)
        self.monitor: HealthMonitor | None = None
        self.serving = threading.Event()
        self._stop = threading.Event()
        self._wake_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._health_changed = False
        self._discover_now = False
        self._retry_serve_at: float | None = None
        self._watcher: inotify.Inotify | None = None
        # (the toolkit's specs it was made from, the GPU IDs, each GPU's edits)
        self._edits_cache: tuple[Any, tuple[str, ...], Mapping[str, GpuEdits | str]] | None = None

    # ------------------------------------------------------------ what is offered

    def slice_devices(self, taints_served: bool) -> list[dict[str, Any]]:
        """The ResourceSlice devices now: every whole GPU, an unhealthy one tainted (or withdrawn when the
        API server does not keep taints)."""
        with self._lock:
            gpus, health = list(self.gpus), dict(self.health)
        out = []
        for gpu in gpus:
            state = health.get(gpu.id, HEALTHY)
            if not state.healthy and not taints_served:
                continue
            out.append(attributes.device(gpu, self.dra.driver_name, state,
                                         attributes.shares_allowed(gpu, self.dra.multiple_allocations),
                                         self.dra.unhealthy_taint_effect, self.settings.allocation_api == "both"))
        return out

    def _edits(self, gpus: Sequence[Gpu]) -> Mapping[str, GpuEdits | str]:
        """Each GPU's CDI edits, worked out again only when the toolkit's specs change (a regenerated spec
        is read at the next prepare) or the GPUs do: a Jetson's come from hundreds of CSV lines."""
        specs = self.toolkit.specs()  # the same list until a spec file changes
        ids = tuple(g.id for g in gpus)
        with self._lock:
            cached = self._edits_cache
            if cached is None or cached[0] is not specs or cached[1] != ids:
                cached = self._edits_cache = (specs, ids, gpu_edits(gpus, self.settings, specs))
            return cached[2]

    # ------------------------------------------------------------ control from other threads

    def stop(self) -> None:
        self._stop.set()
        self._wake()

    def _wake(self) -> None:
        with self._wake_lock, contextlib.suppress(BlockingIOError):
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")

    def request_discovery(self) -> None:
        """SIGHUP: look for GPUs again now (a driver loaded, a GPU replaced)."""
        self._discover_now = True
        self._wake()

    def report_health(self, gpu_id: str, health: Health) -> None:
        """The health monitor's callback (its own thread)."""
        with self._lock:
            if gpu_id not in self.health or self.health[gpu_id] == health:
                return
            self.health[gpu_id] = health
            self._health_changed = True
        if health.healthy:
            log.info("GPU %s is healthy again: its device taint goes", gpu_id)
        else:
            log.warning("GPU %s is unhealthy (%s): tainting its device", gpu_id, health.reason or "no reason given")
        self._wake()

    # ------------------------------------------------------------ run

    def run(self) -> int:
        try:
            with signals.handled({signal.SIGTERM: self.stop, signal.SIGINT: self.stop,
                                  signal.SIGHUP: self.request_discovery}):
                return self._session()
        finally:
            with self._wake_lock:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r = self._wake_w = -1

    def _session(self) -> int:
        watcher = inotify.Inotify()
        selector = selectors.DefaultSelector()
        try:
            self.checkpoint.load()
            claim_spec.remove_stale_temps(self.dra.cdi_dir, self.dra.driver_name)
            self._sync_health()
            try:
                self.dra_server.start()  # serve first: the kubelet dials it as soon as it registers us
                self.registration_server.start()
                self._watcher = watcher
                self._watch_dirs()
            except OSError as exc:
                log.error("%s", exc.strerror or exc)
                return 2
            self.serving.set()
            log.info("serving DRA driver %s for node %s on %s (%d GPU(s)), registration socket %s",
                     self.dra.driver_name, self.node, self.dra.dra_socket, len(self.gpus),
                     self.dra.registration_socket)
            self.publisher.start()
            self._start_monitor()
            sdnotify.notify(f"READY=1\nSTATUS=serving {len(self.gpus)} GPU(s) as {self.dra.driver_name}",
                            self._environ)
            selector.register(watcher.fileno(), selectors.EVENT_READ, "inotify")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            self._loop(selector, watcher)
            sdnotify.notify("STOPPING=1", self._environ)
            log.info("stopping: removing %s and %s", self.dra.registration_socket, self.dra.dra_socket)
            return 0
        finally:
            self.node_service.stopping = True
            self.registration_server.stop()  # the plugin watcher deregisters us first
            self.dra_server.stop()
            self.publisher.stop()
            if self.monitor is not None:
                self.monitor.stop()
            selector.close()
            watcher.close()

    def _loop(self, selector: selectors.BaseSelector, watcher: inotify.Inotify) -> None:
        next_discovery = time.monotonic() + REDISCOVER_S
        next_resend = time.monotonic() + HEALTH_RESEND_S
        while not self._stop.is_set():
            due = min(next_discovery, next_resend) if self.rediscover else next_resend
            if self._retry_serve_at is not None:
                due = min(due, self._retry_serve_at)
            timeout = max(0.0, due - time.monotonic())
            for key, _ in selector.select(timeout):
                if key.data == "wake":
                    _drain(self._wake_r)
                else:
                    self._on_socket_events(watcher.read_events())
            if self._stop.is_set():
                return
            if self._retry_serve_at is not None and time.monotonic() >= self._retry_serve_at:
                self._serve_again()
            with self._lock:
                changed, self._health_changed = self._health_changed, False
            if changed:
                self._sync_health()
                self.publisher.request()
            if time.monotonic() >= next_resend:
                next_resend = time.monotonic() + HEALTH_RESEND_S
                self.device_health.refresh()
                self.dra_server.wake()
            if self.rediscover and (self._discover_now or time.monotonic() >= next_discovery):
                self._discover_now = False
                next_discovery = time.monotonic() + REDISCOVER_S
                self._rediscover()

    def _on_socket_events(self, events: Sequence[inotify.Event]) -> None:
        names = {os.path.basename(self.dra.dra_socket), os.path.basename(self.dra.registration_socket)}
        if any(e.mask & (inotify.IN_Q_OVERFLOW | inotify.IN_IGNORED) or e.name in names for e in events):
            self._serve_again()

    def _watch_dirs(self) -> None:
        """Watch both socket directories (again after one was deleted: its watch went with it)."""
        assert self._watcher is not None
        for directory in (self.dra.socket_dir, self.dra.plugins_registry_dir):
            self._watcher.add_watch(directory, _DIR_EVENTS)

    def _serve_again(self) -> None:
        """Serve again whichever of our sockets is gone (the DRA socket first: a fresh registration
        dials it); on failure try again in a second, never crash."""
        self._retry_serve_at = None
        dra_lost = not self.dra_server.owns_socket()
        for server in (self.dra_server, self.registration_server):
            if server.owns_socket() and not (dra_lost and server is self.registration_server):
                continue
            log.info("our socket %s is gone: serving it again", server.path)
            try:
                server.start()
                self._watch_dirs()
            except OSError as exc:
                log.error("%s; trying again in %.0f s", exc.strerror or exc, SERVE_RETRY_S)
                self._retry_serve_at = time.monotonic() + SERVE_RETRY_S
                return

    # ------------------------------------------------------------ health and devices

    def _sync_health(self) -> None:
        with self._lock:
            states = {attributes.device_name(g): self.health.get(g.id, HEALTHY) for g in self.gpus}
        if self.device_health.set(states):
            self.dra_server.wake()  # the health streams send the new snapshot

    def _start_monitor(self) -> None:
        if not self.gpus:
            return
        self.monitor = self.make_monitor(self.gpus)
        if self.monitor is not None:
            try:
                self.monitor.start(self.gpus, self.report_health)
            except OSError as exc:
                log.error("cannot start health monitoring (%s): GPUs are published as healthy", exc)
                self.monitor = None

    def _rediscover(self) -> None:
        assert self.rediscover is not None
        found = self.rediscover()
        if found is None:
            return
        gpus, left_out = attributes.publishable(found)
        if [g.id for g in gpus] == [g.id for g in self.gpus] and gpus == self.gpus:
            return
        log.info("the GPUs changed: %s -> %s", ", ".join(g.id for g in self.gpus) or "none",
                 ", ".join(g.id for g in gpus) or "none")
        for line in left_out:
            log.warning("%s", line)
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        with self._lock:
            self.gpus = gpus
            self.health = {g.id: self.health.get(g.id, HEALTHY) for g in gpus}
            self._edits_cache = None
        self._sync_health()
        self._start_monitor()
        self.publisher.request()


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass
