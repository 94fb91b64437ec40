"""One run of the plugin: start the parts in order, sleep until something happens, stop cleanly.

One thread runs this loop; the gRPC server has its own (api/grpc_server); health monitors
report into DeviceState. The loop sleeps in select() on inotify (the socket directory and
the config file), a wake pipe (signals, stop, health) and the next timer (registration retry,
watchdog); an idle plugin makes no syscalls between watchdog pings. What happens is handed
to the part it concerns, each in its own module: the kubelet session (kubelet: serve,
register, follow kubelet restarts), the configuration reload (reload) and what systemd and
/healthz see (supervision, with the self_probe); the CDI spec's keeper (cdi/lifecycle) and
signals besides.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..cdi import handover
from ..cdi.lifecycle import CdiSpecKeeper
from ..config.settings import Settings
from ..core.state import DeviceState
from ..health.base import HealthMonitor
from ..host import inotify
from ..model import Gpu, Health
from ..observability.readiness import Readiness
from ..observability.stats import Stats
from ..service.server import PluginServer
from . import dir_events, signals
from .kubelet import KubeletSession
from .reload import ConfigReload
from .supervision import Supervision

if TYPE_CHECKING:
    from ..observability.endpoint import Status

log = logging.getLogger(__name__)


class Daemon:
    def __init__(
        self,
        settings: Settings,
        gpus: Sequence[Gpu],
        monitor: HealthMonitor | None = None,
        reload_settings: Callable[[], Settings] | None = None,
        environ: dict[str, str] | None = None,
        metered_gpus: Sequence[Gpu] = (),
    ) -> None:
        self.gpus = list(gpus)
        # GPUs /metrics reads but the plugin does not advertise (the DRA driver hands them out)
        self._metered = list(metered_gpus)
        self.monitor = monitor
        self._environ = dict(os.environ) if environ is None else environ
        self.stats = Stats()
        self.state = DeviceState()
        self.state.on_health_change(self._health_changed)
        self.readiness = Readiness(self._environ)
        backend = self.gpus[0].backend if self.gpus else None
        # the hand-over the node's NVIDIA runtime honours (ConfigError, naming the fix, when none does)
        settings = handover.resolve(settings, self.gpus)
        self.session = KubeletSession(settings, self.gpus, self.state, self.stats, self.readiness)
        load = None if reload_settings is None else lambda: handover.resolve(reload_settings(), self.gpus)
        self.reload = ConfigReload(load, lambda: self.session.settings, self.apply_settings, backend, self.stats)
        self.supervision = Supervision(self.session, self.state, self.stats, self.readiness, backend or "none",
                                       self._monitor_alive, self._environ)
        self._cdi = CdiSpecKeeper(self.gpus)
        self._stop = threading.Event()
        self._wake_lock = threading.Lock()  # a stop() from another thread never writes to a closed pipe
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # ------------------------------------------------------------ control from other threads

    def stop(self) -> None:
        self._stop.set()
        self._wake()

    def request_reload(self) -> None:
        self.reload.request()
        self._wake()

    def _wake(self) -> None:
        with self._wake_lock, contextlib.suppress(BlockingIOError):  # a full pipe already holds a wake-up
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")

    # ------------------------------------------------------------ what the parts hold, for callers and tests

    @property
    def settings(self) -> Settings:
        return self.session.settings

    @property
    def resource(self) -> str:
        return self.session.resource

    @property
    def server(self) -> PluginServer | None:
        return self.session.server

    @property
    def registered_event(self) -> threading.Event:
        return self.session.registered_event

    @property
    def socket_dir(self) -> str:
        return self.session.socket_dir

    @property
    def kubelet_socket(self) -> str:
        return self.session.kubelet_socket

    @property
    def endpoint(self) -> str:
        return self.session.endpoint

    @property
    def socket_path(self) -> str:
        return self.session.socket_path

    @property
    def status_port(self) -> int | None:
        return self.supervision.status_port

    @property
    def self_probe_timeout(self) -> float:
        return self.supervision.self_probe_timeout

    @self_probe_timeout.setter
    def self_probe_timeout(self, seconds: float) -> None:
        self.supervision.self_probe_timeout = seconds

    def status(self) -> Status:
        return self.supervision.status()

    def alive(self) -> bool:
        return self.supervision.alive()

    # ------------------------------------------------------------ main loop

    def run(self) -> int:
        try:
            with signals.handled({signal.SIGTERM: self.stop, signal.SIGINT: self.stop,
                                  signal.SIGHUP: self.request_reload}):
                return self._session()
        finally:  # after the handlers are restored: no signal can reach the closed pipe
            with self._wake_lock:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r = self._wake_w = -1

    def _session(self) -> int:
        watcher = inotify.Inotify()
        selector = selectors.DefaultSelector()
        try:
            if not self.supervision.serve_endpoint(self.settings, self.gpus or self._metered, self.monitor):
                return 2
            if not self.session.watch(watcher):
                return 2
            self.reload.watch(watcher, self.settings.config_file)
            selector.register(watcher.fileno(), selectors.EVENT_READ, "inotify")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            self.session.advertise()
            self._cdi.sync(self.settings)
            if self.monitor is not None and self.gpus:
                try:
                    self.monitor.start(self.gpus, self._report_health)
                except OSError as exc:
                    log.error("cannot start health monitoring: %s (check --simulated-health-dir / --host-root)", exc)
                    self.monitor = None
                    return 2
            self.session.start()
            # up: serving, retrying, or nothing to serve. Registration is not awaited (see readiness)
            self.readiness.ready()
            self._loop(selector, watcher)
            log.info("stopping: removing %s", self.socket_path)
            self.readiness.stopping()
            return 0
        finally:
            self.supervision.close()
            self.session.close()
            if self.monitor is not None:
                self.monitor.stop()
            selector.close()
            watcher.close()

    def _loop(self, selector: selectors.BaseSelector, watcher: inotify.Inotify) -> None:
        self.supervision.start_watchdog()
        while not self._stop.is_set():
            now = time.monotonic()
            deadlines = [t for t in (self.session.retry_at, self.supervision.ping_at) if t is not None]
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            self.stats.add("loop_wakeups")
            for key, _ in selector.select(timeout):
                if key.data == "wake":
                    _drain(self._wake_r)
                else:
                    self._on_inotify(watcher.read_events())
            self.reload.run_if_requested()
            if not self._stop.is_set():
                self.session.retry_if_due()
            self.supervision.ping_if_due()

    def _on_inotify(self, events: Sequence[inotify.Event]) -> None:
        config_file = self.settings.config_file
        watches = dir_events.Watches(self.session.socket_wd, self.reload.config_wd,
                                     os.path.basename(self.kubelet_socket), self.endpoint,
                                     os.path.basename(config_file) if config_file else None)
        seen = dir_events.classify(events, watches)
        if seen.reload and self.reload.enabled:
            self.reload.request()
        self.session.on_events(seen)

    # ------------------------------------------------------------ configuration

    def apply_settings(self, new: Settings, kept: Sequence[str] = ()) -> None:
        """Switch to `new`; keeps the registration when the resource name stays the same."""
        self.stats.add("config_reloads")
        if kept:
            log.warning("configuration change to %s needs a restart (systemctl restart gpu-device-plugin); "
                        "keeping their running values and applying the rest", ", ".join(kept))
        if new.log_level != self.settings.log_level:
            logging.getLogger().setLevel(new.log_level.upper())
        self._cdi.switch(self.settings, new)
        self.session.switch(new)

    # ------------------------------------------------------------ health

    def _report_health(self, gpu_id: str, health: Health) -> None:
        self.state.report_health(gpu_id, health)

    def _health_changed(self, gpu_id: str, health: Health) -> None:
        self.stats.add("health_events")
        if health.healthy:
            log.info("GPU %s is healthy again", gpu_id)
        else:
            log.warning("GPU %s is unhealthy: %s", gpu_id, health.reason or "no reason given")

    def _monitor_alive(self) -> bool:
        return self.monitor is None or not self.gpus or self.monitor.alive()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
