"""The kubelet session: serve, register, follow kubelet restarts, stop cleanly.

One thread runs this loop; the gRPC server has its own (api/grpc_server); health monitors report into
DeviceState. The loop sleeps in select() on inotify (the socket directory and the config
file), a wake pipe (signals, stop, health) and the next timer (registration retry,
watchdog); an idle plugin makes no syscalls between watchdog pings. The pieces it drives
live in their own modules: dir_events (what inotify says), backoff, kubelet_identity,
reload_policy, cdi_lifecycle, watchdog (self-probe), readiness (sd_notify), signals, stats.
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

from .. import __version__
from ..cdi.lifecycle import CdiSpecKeeper
from ..config.settings import ConfigError, Settings
from ..core import policy
from ..core.state import DeviceState
from ..health.base import HealthMonitor
from ..host import inotify
from ..model import Gpu, Health
from ..observability import readiness, sdnotify
from ..observability.readiness import Readiness
from ..observability.stats import Stats
from ..observability.watchdog import SelfProbe
from ..service.server import PluginServer, RegistrationError, register
from ..service.servicer import DevicePluginServicer
from . import dir_events, signals
from .backoff import Backoff
from .kubelet_identity import Identity, identity
from .socket_check import socket_path_problem

if TYPE_CHECKING:
    from ..observability.endpoint import Status

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 10.0


class Daemon:
    def __init__(
        self,
        settings: Settings,
        gpus: Sequence[Gpu],
        monitor: HealthMonitor | None = None,
        reload_settings: Callable[[], Settings] | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.gpus = list(gpus)
        self.monitor = monitor
        self._reload_settings = reload_settings
        self._environ = dict(os.environ) if environ is None else environ
        self.stats = Stats()
        self.state = DeviceState()
        self.state.on_health_change(self._health_changed)
        self.resource = policy.resource_name(settings)
        self.server: PluginServer | None = None
        self.readiness = Readiness(self._environ)
        self._stop = threading.Event()
        self._reload_requested = threading.Event()
        self._wake_lock = threading.Lock()  # a stop() from another thread never writes to a closed pipe
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._retry = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        self._cdi = CdiSpecKeeper(self.gpus)
        self._watcher: inotify.Inotify | None = None
        self._socket_wd: int | None = None
        self._config_wd: int | None = None
        self._needs_resync = False
        self._probe = SelfProbe()
        self._registered_with: Identity | None = None  # kubelet.sock we registered through
        self.status_port: int | None = None  # bound port of the /metrics listener (0 in tests picks one)
        self.registered_event = threading.Event()  # set after each successful registration (tests)

    # ------------------------------------------------------------ control from other threads

    def stop(self) -> None:
        self._stop.set()
        self._wake()

    def request_reload(self) -> None:
        self._reload_requested.set()
        self._wake()

    def _wake(self) -> None:
        with self._wake_lock, contextlib.suppress(BlockingIOError):  # a full pipe already holds a wake-up
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")

    @property
    def self_probe_timeout(self) -> float:
        return self._probe.timeout

    @self_probe_timeout.setter
    def self_probe_timeout(self, seconds: float) -> None:
        self._probe.timeout = seconds

    # ------------------------------------------------------------ paths

    @property
    def socket_dir(self) -> str:
        return self.settings.socket_dir

    @property
    def kubelet_socket(self) -> str:
        return self.settings.kubelet_socket

    @property
    def endpoint(self) -> str:
        return policy.socket_name(self.resource)

    @property
    def socket_path(self) -> str:
        return os.path.join(self.socket_dir, self.endpoint)

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
        status_server = None
        try:
            if self.settings.metrics_address:
                from ..metrics.telemetry import Telemetry  # only with --metrics-address: start-up time
                from ..observability.endpoint import StatusServer

                status_server = StatusServer(self.settings.metrics_address, self.status,
                                             Telemetry.for_plugin(self.settings, self.gpus, self.monitor))
                try:
                    status_server.start()
                except OSError as exc:
                    log.error("cannot serve /metrics on %s (%s): choose a free address with --metrics-address",
                              self.settings.metrics_address, exc.strerror or exc)
                    status_server = None
                    return 2
                self.status_port = status_server.port
            self._watcher = watcher
            try:
                os.makedirs(self.socket_dir, mode=0o750, exist_ok=True)
                self._socket_wd = watcher.add_watch(self.socket_dir, dir_events.DIR_EVENTS)
            except OSError as exc:
                log.error("cannot use the kubelet's socket directory %s (%s): check --kubelet-socket and that "
                          "the plugin runs as root", self.socket_dir, exc.strerror or exc)
                return 2
            problem = socket_path_problem(self.socket_path)
            if problem:
                log.error("%s", problem)
                return 2
            if self.settings.config_file and self._reload_settings is not None:
                self._config_wd = dir_events.watch_config(watcher, self.settings.config_file)
            selector.register(watcher.fileno(), selectors.EVENT_READ, "inotify")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            self.state.set_devices(policy.advertised_devices(self.gpus, self.settings))
            self._cdi.sync(self.settings)
            if self.monitor is not None and self.gpus:
                try:
                    self.monitor.start(self.gpus, self._report_health)
                except OSError as exc:
                    log.error("cannot start health monitoring: %s (check --simulated-health-dir / --host-root)", exc)
                    self.monitor = None
                    return 2
            if self.state.devices():
                if self._serve():  # on failure a retry is already scheduled
                    self._try_register()
            else:
                log.warning("no GPUs to advertise: not registering %s; waiting (stop with SIGTERM)", self.resource)
                self.readiness.update(readiness.NO_GPUS)
            # up: serving, retrying, or nothing to serve. Registration is not awaited (see readiness)
            self.readiness.ready()
            self._loop(selector, watcher)
            log.info("stopping: removing %s", self.socket_path)
            self.readiness.stopping()
            return 0
        finally:
            if status_server is not None:
                status_server.stop()
            self._probe.close()
            if self.server is not None:
                self.server.stop(remove=True)
                self.server = None
            if self.monitor is not None:
                self.monitor.stop()
            selector.close()
            watcher.close()
            self._watcher = None

    def _loop(self, selector: selectors.BaseSelector, watcher: inotify.Inotify) -> None:
        watchdog = sdnotify.watchdog_interval(self._environ)
        next_ping = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            deadlines = [t for t in (self._retry.due_at, next_ping if watchdog else None) if t is not None]
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            self.stats.add("loop_wakeups")
            for key, _ in selector.select(timeout):
                if key.data == "wake":
                    _drain(self._wake_r)
                else:
                    self._on_inotify(watcher.read_events())
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self._reload()
            if self._retry.due() and not self._stop.is_set():
                if self._needs_resync:
                    self._resync()
                else:
                    self._try_register()
            if watchdog and time.monotonic() >= next_ping:
                if self.alive():
                    sdnotify.notify("WATCHDOG=1", self._environ)
                else:
                    log.error("self-check failed: not pinging the systemd watchdog so systemd restarts us")
                next_ping = time.monotonic() + watchdog

    # ------------------------------------------------------------ events

    def _on_inotify(self, events: Sequence[inotify.Event]) -> None:
        config_file = self.settings.config_file
        watches = dir_events.Watches(self._socket_wd, self._config_wd, os.path.basename(self.kubelet_socket),
                                     self.endpoint, os.path.basename(config_file) if config_file else None)
        seen = dir_events.classify(events, watches)
        if seen.reload and self._reload_settings is not None:
            self._reload_requested.set()
        if seen.resync:
            self._resync()
            return  # the re-check covers the rest
        # our socket first: the kubelet wipes it before it re-creates kubelet.sock
        if seen.endpoint_deleted and self.server is not None and not self.server.owns_socket():
            self._on_socket_lost()
        if seen.kubelet_started:
            self._on_kubelet_started()

    def _resync(self) -> None:
        """Work out from the files what the lost events would have said."""
        log.warning("socket directory events were lost or the directory was removed: re-checking %s",
                    self.socket_dir)
        self._needs_resync = False
        try:
            os.makedirs(self.socket_dir, mode=0o750, exist_ok=True)
            assert self._watcher is not None
            self._socket_wd = self._watcher.add_watch(self.socket_dir, dir_events.DIR_EVENTS | inotify.IN_MASK_ADD)
        except OSError as exc:
            self._needs_resync = True
            self._schedule_retry(f"cannot watch {self.socket_dir} ({exc})")
            return
        if not self.state.devices():
            return
        if self.server is None or not self.server.owns_socket():
            self._on_socket_lost()
        elif identity(self.kubelet_socket) != self._registered_with:
            self._on_kubelet_started()

    def _on_kubelet_started(self) -> None:
        if not self.state.devices():
            return
        if self.stats.registrations:
            self.stats.add("kubelet_restarts")  # the kubelet's first appearance is not a restart
        if self.stats.registered and identity(self.kubelet_socket) == self._registered_with:
            return  # our socket's deletion already led us to register with this very kubelet
        log.info("kubelet socket %s (re)created: registering again", self.kubelet_socket)
        self._retry.reset()
        if (self.stats.registered or self.server is None) and not self._serve():
            return  # the old stream belonged to the old kubelet: serve afresh first (retry is scheduled)
        self._try_register()

    def _on_socket_lost(self) -> None:
        log.info("our socket %s was removed (kubelet restart?): serving again", self.socket_path)
        self._retry.reset()
        if self._serve():
            self._try_register()

    # ------------------------------------------------------------ serving and registration

    def _serve(self) -> bool:
        """(Re)start our gRPC server on a fresh socket; on failure retry later, never crash."""
        if self.server is not None:
            self.server.stop(remove=self.server.owns_socket())
            self.server = None
        self._set_registered(False)
        servicer = DevicePluginServicer(self.state, lambda: self.settings, self._allocated)
        server = PluginServer(self.socket_path, servicer)
        try:
            os.makedirs(self.socket_dir, mode=0o750, exist_ok=True)
            server.start()
        except OSError as exc:
            self._schedule_retry(f"cannot listen on {self.socket_path} ({exc})")
            return False
        self.server = server
        log.info("serving %s on %s (%d devices)", self.resource, self.socket_path, len(self.state.devices()))
        self.readiness.update(readiness.waiting_for_kubelet(self.kubelet_socket))
        return True

    def _schedule_retry(self, why: str) -> None:
        delay = self._retry.schedule()
        log.warning("%s; retrying in %.2fs", why, delay)
        self.readiness.update(readiness.retrying(why, delay))

    def _try_register(self) -> None:
        self._retry.cancel()
        # a socket deleted under us cannot be dialled back: serve afresh before registering
        if (self.server is None or not self.server.owns_socket()) and not self._serve():
            return
        assert self.server is not None
        if not os.path.exists(self.kubelet_socket):
            log.info("waiting for the kubelet: %s does not exist yet", self.kubelet_socket)
            self.readiness.update(readiness.waiting_for_kubelet(self.kubelet_socket))
            return  # inotify tells us when it appears
        started = time.monotonic()
        kubelet_identity = identity(self.kubelet_socket)
        self.server.servicer.expect_kubelet()
        try:
            register(self.kubelet_socket, self.endpoint, self.resource)
        except RegistrationError as exc:
            self.stats.add("registration_failures")
            self._schedule_retry(f"registration with {self.kubelet_socket} failed ({exc})")
            return
        self._retry.reset()
        self._registered_with = kubelet_identity
        self.stats.add("registrations")
        self._set_registered(True)
        log.info("registered %s with the kubelet (%s) in %.0f ms", self.resource, self.endpoint,
                 (time.monotonic() - started) * 1000)
        self.readiness.update(readiness.registered(len(self.state.devices()), self.resource, self.kubelet_socket))
        if self.stats.first_registered_at is None:
            self.stats.set(first_registered_at=time.monotonic())
        self.registered_event.set()

    def _set_registered(self, value: bool) -> None:
        self.stats.set(registered=value)
        if not value:
            self.registered_event.clear()

    # ------------------------------------------------------------ health, allocation

    def _report_health(self, gpu_id: str, health: Health) -> None:
        self.state.report_health(gpu_id, health)

    def _health_changed(self, gpu_id: str, health: Health) -> None:
        self.stats.add("health_events")
        if health.healthy:
            log.info("GPU %s is healthy again", gpu_id)
        else:
            log.warning("GPU %s is unhealthy: %s", gpu_id, health.reason or "no reason given")

    def _allocated(self, ids: list[str]) -> None:
        self.stats.add("allocations")

    def status(self) -> Status:
        from ..observability.endpoint import Status

        states = self.state.snapshot()[1]
        server = self.server  # _serve may swap it from the main loop while /healthz reads
        healthy = sum(1 for _, ok, _ in states if ok)
        counts = self.stats.snapshot()
        return Status(
            version=__version__, backend=self.gpus[0].backend if self.gpus else "none", resource=self.resource,
            healthy_devices=healthy, unhealthy_devices=len(states) - healthy, registered=counts.registered,
            streams=server.servicer.streams if server is not None else 0,
            monitor_alive=self.monitor is None or not self.gpus or self.monitor.alive(),
            registrations=counts.registrations, registration_failures=counts.registration_failures,
            kubelet_restarts=counts.kubelet_restarts, allocations=counts.allocations,
            health_events=counts.health_events, config_reloads=counts.config_reloads,
            config_rejections=counts.config_rejections, state=self.readiness.status,
        )

    def alive(self) -> bool:
        """For the watchdog: the health loop runs and our gRPC server still answers its own socket."""
        if self.monitor is not None and self.gpus and not self.monitor.alive():
            return False
        server = self.server
        if server is None or not self.stats.registered:
            return True  # waiting for the kubelet is a healthy state
        if not server.owns_socket():
            return False
        return self._probe.answers(server, self.socket_path)

    # ------------------------------------------------------------ configuration reload

    def _reload(self) -> None:
        if self._reload_settings is None:
            return
        try:
            new = self._reload_settings()
        except Exception as exc:
            self._reject(exc if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}")
            return
        from ..config.reload_policy import plan  # only on a reload: start-up time

        decided = plan(self.settings, new, self.gpus[0].backend if self.gpus else None)
        if decided.rejection:
            self._reject(decided.rejection)
        elif decided.settings is not None:
            self.apply_settings(decided.settings, decided.kept)

    def _reject(self, reason: object) -> None:
        self.stats.add("config_rejections")
        log.error("configuration change rejected, keeping the last good one: %s", reason)

    def apply_settings(self, new: Settings, kept: Sequence[str] = ()) -> None:
        """Switch to `new`; keeps the registration when the resource name stays the same."""
        old_resource = self.resource
        self.stats.add("config_reloads")
        if kept:
            log.warning("configuration change to %s needs a restart (systemctl restart gpu-device-plugin); "
                        "keeping their running values and applying the rest", ", ".join(kept))
        if new.log_level != self.settings.log_level:
            logging.getLogger().setLevel(new.log_level.upper())
        self._cdi.switch(self.settings, new)
        self.settings = new
        self.resource = policy.resource_name(new)
        self.state.set_devices(policy.advertised_devices(self.gpus, new))
        log.info("configuration reloaded: %s, %d devices", self.resource, len(self.state.devices()))
        if self.resource != old_resource and self.state.devices():
            if self.server is not None:
                self.server.stop(remove=True)
                self.server = None
            if self._serve():
                self._try_register()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
