"""The kubelet session: serve, register, follow kubelet restarts, stop cleanly.

One thread runs this loop; gRPC has its own threads; health monitors report into
DeviceState. The loop sleeps in select() on inotify (the socket directory and the config
file), a wake pipe (signals, stop, health) and the next timer (registration retry,
watchdog); an idle plugin makes no syscalls between watchdog pings.
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
from dataclasses import dataclass, field

import grpc

from . import __version__, config, inotify, policy, sdnotify
from .api import pb, rpc
from .cdi_lifecycle import CdiSpecKeeper
from .health.base import HealthMonitor
from .model import Gpu, Health
from .observability import Status, StatusServer
from .server import PluginServer, RegistrationError, register
from .servicer import DevicePluginServicer
from .settings import ConfigError, Settings
from .socket_check import socket_path_problem
from .state import DeviceState

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 10.0
DIR_EVENTS = inotify.IN_CREATE | inotify.IN_DELETE | inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO
# Not IN_CREATE: a file is complete only when its writer closes it or it is renamed into place.
FILE_EVENTS = inotify.IN_CLOSE_WRITE | inotify.IN_MOVED_TO
# Changing these needs a restart; a reload keeps the running values and says so.
RESTART_FIELDS = ("device_discovery_strategy", "simulated_gpus", "host_root", "kubelet_socket",
                  "simulated_health_dir", "metrics_address", "health_recovery_period")


@dataclass
class Stats:
    """Counters for /metrics and the tests."""

    registrations: int = 0
    registration_failures: int = 0
    kubelet_restarts: int = 0
    allocations: int = 0
    health_events: int = 0
    config_reloads: int = 0
    config_rejections: int = 0
    loop_wakeups: int = 0  # main-loop iterations: proves the loop sleeps when nothing happens
    registered: bool = False
    started_at: float = field(default_factory=time.monotonic)
    first_registered_at: float | None = None


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
        self._stop = threading.Event()
        self._reload_requested = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._retry_at: float | None = None
        self._retry_delay = RETRY_FIRST_S
        self._ready_sent = False
        self._cdi = CdiSpecKeeper(self.gpus)
        self._watcher: inotify.Inotify
        self._needs_resync = False
        self._socket_wd: int | None = None
        self.self_probe_timeout = 5.0  # seconds our own server gets to answer the watchdog's probe
        self._probe_channel: grpc.Channel | None = None
        self._probe_for: PluginServer | None = None
        self._registered_with: tuple[int, int] | None = None  # kubelet.sock we registered through
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
        with contextlib.suppress(BlockingIOError):  # a full pipe already holds a wake-up
            os.write(self._wake_w, b"x")

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
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
            signal.signal(signal.SIGHUP, lambda *_: self.request_reload())
        watcher = inotify.Inotify()
        selector = selectors.DefaultSelector()
        status_server = None
        try:
            if self.settings.metrics_address:
                status_server = StatusServer(self.settings.metrics_address, self.status)
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
                self._socket_wd = watcher.add_watch(self.socket_dir, DIR_EVENTS)
            except OSError as exc:
                log.error("cannot use the kubelet's socket directory %s (%s): check --kubelet-socket and that "
                          "the plugin runs as root", self.socket_dir, exc.strerror or exc)
                return 2
            problem = socket_path_problem(self.socket_path)
            if problem:
                log.error("%s", problem)
                return 2
            config_wd = self._watch_config(watcher)
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
                # nothing to register, so nothing to wait for: a GPU-less node must not hold up boot
                sdnotify.notify("READY=1\nSTATUS=no GPUs on this node; nothing registered", self._environ)
            watchdog = sdnotify.watchdog_interval(self._environ)
            next_ping = time.monotonic()
            while not self._stop.is_set():
                now = time.monotonic()
                deadlines = [t for t in (self._retry_at, next_ping if watchdog else None) if t is not None]
                timeout = max(0.0, min(deadlines) - now) if deadlines else None
                self.stats.loop_wakeups += 1
                for key, _ in selector.select(timeout):
                    if key.data == "wake":
                        _drain(self._wake_r)
                    else:
                        self._on_inotify(watcher.read_events(), config_wd)
                if self._reload_requested.is_set():
                    self._reload_requested.clear()
                    self._reload()
                if self._retry_at is not None and time.monotonic() >= self._retry_at and not self._stop.is_set():
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
            log.info("stopping: removing %s", self.socket_path)
            sdnotify.notify("STOPPING=1", self._environ)
            return 0
        finally:
            if status_server is not None:
                status_server.stop()
            if self._probe_channel is not None:
                self._probe_channel.close()
            if self.server is not None:
                self.server.stop(remove=True)
                self.server = None
            if self.monitor is not None:
                self.monitor.stop()
            selector.close()
            watcher.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _watch_config(self, watcher: inotify.Inotify) -> int | None:
        path = self.settings.config_file
        if not path or self._reload_settings is None:
            return None
        try:
            # Watch the directory: editors and ConfigMap updates replace the file rather than write it.
            # IN_MASK_ADD: when the config shares the socket directory, keep that watch's events too
            return watcher.add_watch(os.path.dirname(os.path.abspath(path)), FILE_EVENTS | inotify.IN_MASK_ADD)
        except OSError as exc:
            log.warning("cannot watch %s for changes (%s); reload with SIGHUP", path, exc)
            return None

    # ------------------------------------------------------------ events

    def _on_inotify(self, events: Sequence[inotify.Event], config_wd: int | None) -> None:
        kubelet_name = os.path.basename(self.kubelet_socket)
        config_name = os.path.basename(self.settings.config_file) if self.settings.config_file else None
        for event in events:
            if event.mask & inotify.IN_Q_OVERFLOW or (event.wd == self._socket_wd and event.mask & inotify.IN_IGNORED):
                self._resync()  # events were lost, or the directory itself went away
            elif event.wd == self._socket_wd:
                if event.name == kubelet_name and event.mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO):
                    self._on_kubelet_started()
                elif (event.name == self.endpoint and event.mask & (inotify.IN_DELETE | inotify.IN_MOVED_FROM)
                      and self.server is not None and not self.server.owns_socket()):
                    self._on_socket_lost()
            # ConfigMap volumes swap a `..data` symlink instead of touching the file itself
            if config_wd is not None and event.wd == config_wd and event.mask & FILE_EVENTS and (
                    event.name == config_name or event.name.startswith("..")):
                self._reload_requested.set()

    def _resync(self) -> None:
        """Work out from the files what the lost events would have said."""
        log.warning("socket directory events were lost or the directory was removed: re-checking %s",
                    self.socket_dir)
        self._needs_resync = False
        try:
            os.makedirs(self.socket_dir, mode=0o750, exist_ok=True)
            self._socket_wd = self._watcher.add_watch(self.socket_dir, DIR_EVENTS | inotify.IN_MASK_ADD)
        except OSError as exc:
            self._needs_resync = True
            self._schedule_retry(f"cannot watch {self.socket_dir} ({exc})")
            return
        if not self.state.devices():
            return
        if self.server is None or not self.server.owns_socket():
            self._on_socket_lost()
        elif _identity(self.kubelet_socket) != self._registered_with:
            self._on_kubelet_started()

    def _on_kubelet_started(self) -> None:
        if not self.state.devices():
            return
        if self.stats.registrations:
            self.stats.kubelet_restarts += 1  # the kubelet's first appearance is not a restart
        if self.stats.registered and _identity(self.kubelet_socket) == self._registered_with:
            return  # our socket's deletion already led us to register with this very kubelet
        log.info("kubelet socket %s (re)created: registering again", self.kubelet_socket)
        self._retry_delay = RETRY_FIRST_S
        if (self.stats.registered or self.server is None) and not self._serve():
            return  # the old stream belonged to the old kubelet: serve afresh first (retry is scheduled)
        self._try_register()

    def _on_socket_lost(self) -> None:
        log.info("our socket %s was removed (kubelet restart?): serving again", self.socket_path)
        self._retry_delay = RETRY_FIRST_S
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
        except (OSError, RuntimeError) as exc:  # grpcio raises RuntimeError for a failed bind
            self._schedule_retry(f"cannot listen on {self.socket_path} ({exc})")
            return False
        self.server = server
        log.info("serving %s on %s (%d devices)", self.resource, self.socket_path, len(self.state.devices()))
        return True

    def _schedule_retry(self, why: str) -> None:
        self._retry_at = time.monotonic() + self._retry_delay
        log.warning("%s; retrying in %.2fs", why, self._retry_delay)
        self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S)

    def _try_register(self) -> None:
        self._retry_at = None
        if self.server is None and not self._serve():
            return
        if not os.path.exists(self.kubelet_socket):
            log.info("waiting for the kubelet: %s does not exist yet", self.kubelet_socket)
            return  # inotify tells us when it appears
        started = time.monotonic()
        kubelet_identity = _identity(self.kubelet_socket)
        self.server.servicer.expect_kubelet()
        try:
            register(self.kubelet_socket, self.endpoint, self.resource)
        except RegistrationError as exc:
            self.stats.registration_failures += 1
            self._schedule_retry(f"registration with {self.kubelet_socket} failed ({exc})")
            return
        self._retry_delay = RETRY_FIRST_S
        self._registered_with = kubelet_identity
        self.stats.registrations += 1
        self._set_registered(True)
        log.info("registered %s with the kubelet (%s) in %.0f ms", self.resource, self.endpoint,
                 (time.monotonic() - started) * 1000)
        if not self._ready_sent:
            sdnotify.notify("READY=1", self._environ)
            self._ready_sent = True
            self.stats.first_registered_at = time.monotonic()
        self.registered_event.set()

    def _set_registered(self, value: bool) -> None:
        self.stats.registered = value
        if not value:
            self.registered_event.clear()

    # ------------------------------------------------------------ health, allocation

    def _report_health(self, gpu_id: str, health: Health) -> None:
        self.state.report_health(gpu_id, health)

    def _health_changed(self, gpu_id: str, health: Health) -> None:
        self.stats.health_events += 1
        if health.healthy:
            log.info("GPU %s is healthy again", gpu_id)
        else:
            log.warning("GPU %s is unhealthy: %s", gpu_id, health.reason or "no reason given")

    def _allocated(self, ids: list[str]) -> None:
        self.stats.allocations += 1

    def status(self) -> Status:
        states = self.state.snapshot()[1]
        server = self.server  # _serve may swap it from the main loop while /healthz reads
        healthy = sum(1 for _, ok, _ in states if ok)
        stats = self.stats
        return Status(
            version=__version__, backend=self.gpus[0].backend if self.gpus else "none", resource=self.resource,
            healthy_devices=healthy, unhealthy_devices=len(states) - healthy, registered=stats.registered,
            streams=server.servicer.streams if server is not None else 0,
            monitor_alive=self.monitor is None or not self.gpus or self.monitor.alive(),
            registrations=stats.registrations, registration_failures=stats.registration_failures,
            kubelet_restarts=stats.kubelet_restarts, allocations=stats.allocations,
            health_events=stats.health_events, config_reloads=stats.config_reloads,
            config_rejections=stats.config_rejections,
        )

    def alive(self) -> bool:
        """For the watchdog: the health loop runs and our gRPC server still answers its own socket."""
        if self.monitor is not None and self.gpus and not self.monitor.alive():
            return False
        if self.server is None or not self.stats.registered:
            return True  # waiting for the kubelet is a healthy state
        if not self.server.owns_socket():
            return False
        return self._self_probe()

    def _self_probe(self) -> bool:
        # One channel per server instance: a wedged thread pool shows up as a timeout here.
        if self._probe_for is not self.server:
            if self._probe_channel is not None:
                self._probe_channel.close()
            self._probe_channel = grpc.insecure_channel(f"unix:{self.socket_path}")
            self._probe_for = self.server
        try:
            stub = rpc.Stub(self._probe_channel, "DevicePlugin")
            stub.GetDevicePluginOptions(pb.Empty(), timeout=self.self_probe_timeout)
            return True
        except grpc.RpcError as exc:
            log.error("self-check: our gRPC server did not answer (%s)", exc.code() if hasattr(exc, "code") else exc)
            return False

    # ------------------------------------------------------------ configuration reload

    def _reload(self) -> None:
        if self._reload_settings is None:
            return
        try:
            new = self._reload_settings()
        except Exception as exc:
            self.stats.config_rejections += 1
            reason = exc if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
            log.error("configuration change rejected, keeping the last good one: %s", reason)
            return
        if new == self.settings:
            return
        conflict = config.backend_conflict(new, self.gpus[0].backend) if self.gpus else None
        if conflict:
            self.stats.config_rejections += 1
            log.error("configuration change rejected, keeping the last good one: %s", conflict)
            return
        self.apply_settings(new)

    def apply_settings(self, new: Settings) -> None:
        """Switch to `new`; keeps the registration when the resource name stays the same."""
        old_resource = self.resource
        self.stats.config_reloads += 1
        changed = [f for f in RESTART_FIELDS if getattr(new, f) != getattr(self.settings, f)]
        if changed:
            log.warning("configuration change to %s needs a restart (systemctl restart gpu-device-plugin); "
                        "keeping their running values and applying the rest", ", ".join(changed))
            new = _keep_fields(new, self.settings, changed)
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


def _keep_fields(new: Settings, old: Settings, names: Sequence[str]) -> Settings:
    from dataclasses import replace

    return replace(new, **{n: getattr(old, n) for n in names})


def _identity(path: str) -> tuple[int, int] | None:
    """Which socket file this is: a re-created kubelet.sock differs in inode or change time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
