"""What the session's supervisors see: systemd's watchdog, /healthz and /metrics.

The watchdog is pinged only while the self-check passes (the health loop runs, our gRPC
server still answers on its own socket), so systemd restarts a wedged plugin. The optional
listener serves the same picture as a Status, with the GPUs' telemetry, and is loaded only
when --metrics-address asks for it. READY and STATUS lines go through Readiness, which the
kubelet session updates as it goes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .. import __version__
from ..config.settings import Settings
from ..core.state import DeviceState
from ..health.base import HealthMonitor
from ..model import Gpu
from ..observability import sdnotify
from ..observability.readiness import Readiness
from ..observability.stats import Stats
from .kubelet import KubeletSession
from .self_probe import SelfProbe

if TYPE_CHECKING:
    from ..observability.endpoint import Status, StatusServer

log = logging.getLogger(__name__)


class Supervision:
    def __init__(self, session: KubeletSession, state: DeviceState, stats: Stats, readiness: Readiness,
                 backend: str, monitor_alive: Callable[[], bool], environ: dict[str, str]) -> None:
        self._session = session
        self._state = state
        self._stats = stats
        self._readiness = readiness
        self._backend = backend  # the discovery backend serving, "none" without GPUs
        self._monitor_alive = monitor_alive
        self._environ = environ
        self._probe = SelfProbe()
        self._watchdog: float | None = None  # seconds between pings, once the loop runs
        self._next_ping: float | None = None
        self._status_server: StatusServer | None = None
        self.status_port: int | None = None  # bound port of the /metrics listener (0 in tests picks one)
        self._node_name: str | None = None  # the Hostname label, looked up when first served

    @property
    def self_probe_timeout(self) -> float:
        return self._probe.timeout

    @self_probe_timeout.setter
    def self_probe_timeout(self, seconds: float) -> None:
        self._probe.timeout = seconds

    # ------------------------------------------------------------ /healthz and /metrics

    def serve_endpoint(self, settings: Settings, gpus: Sequence[Gpu], monitor: HealthMonitor | None) -> bool:
        """Start the listener when --metrics-address is set; False, logged, when its address cannot be bound."""
        if not settings.metrics_address:
            return True
        from ..metrics.telemetry import Telemetry  # only with --metrics-address: start-up time
        from ..observability.endpoint import StatusServer

        server = StatusServer(settings.metrics_address, self.status, Telemetry.for_plugin(settings, gpus, monitor))
        try:
            server.start()
        except OSError as exc:
            log.error("cannot serve /metrics on %s (%s): choose a free address with --metrics-address",
                      settings.metrics_address, exc.strerror or exc)
            return False
        self._status_server = server
        self.status_port = server.port
        return True

    def status(self) -> Status:
        from ..observability.endpoint import Status

        states = self._state.snapshot()[1]
        server = self._session.server  # the session may swap it from the main loop while /healthz reads
        healthy = sum(1 for _, ok, _ in states if ok)
        counts = self._stats.snapshot()
        return Status(
            version=__version__, backend=self._backend, resource=self._session.resource,
            healthy_devices=healthy, unhealthy_devices=len(states) - healthy, registered=counts.registered,
            streams=server.servicer.streams if server is not None else 0,
            monitor_alive=self._monitor_alive(),
            registrations=counts.registrations, registration_failures=counts.registration_failures,
            kubelet_restarts=counts.kubelet_restarts, allocations=counts.allocations,
            health_events=counts.health_events, config_reloads=counts.config_reloads,
            config_rejections=counts.config_rejections, state=self._readiness.status, node=self._node(),
        )

    def _node(self) -> str:
        if self._node_name is None:
            from ..observability.node import node_name

            self._node_name = node_name()
        return self._node_name

    # ------------------------------------------------------------ systemd's watchdog

    def alive(self) -> bool:
        """For the watchdog: the health loop runs and our gRPC server still answers its own socket."""
        if not self._monitor_alive():
            return False
        server = self._session.server
        if server is None or not self._stats.registered:
            return True  # waiting for the kubelet is a healthy state
        if not server.owns_socket():
            return False
        return self._probe.answers(server, self._session.socket_path)

    def start_watchdog(self) -> None:
        """When systemd runs a watchdog for us, the first ping is due at once."""
        self._watchdog = sdnotify.watchdog_interval(self._environ)
        self._next_ping = time.monotonic() if self._watchdog else None

    @property
    def ping_at(self) -> float | None:
        """When the next watchdog ping is due (monotonic clock); None without a watchdog."""
        return self._next_ping

    def ping_if_due(self) -> None:
        if self._watchdog and self._next_ping is not None and time.monotonic() >= self._next_ping:
            if self.alive():
                sdnotify.notify("WATCHDOG=1", self._environ)
            else:
                log.error("self-check failed: not pinging the systemd watchdog so systemd restarts us")
            self._next_ping = time.monotonic() + self._watchdog

    def close(self) -> None:
        if self._status_server is not None:
            self._status_server.stop()
            self._status_server = None
        self._probe.close()
