"""Serve first, then register; follow the kubelet's restarts; retry what failed.

Our gRPC server listens on a socket in the kubelet's socket directory and the Register call
tells the kubelet where. What that directory's events mean for them (dir_events): a
re-created kubelet.sock is a new kubelet to register with, the deletion of our socket means
serving afresh, lost events mean working it out from the files. A failure is retried with
back-off, never raised. The daemon's loop drives this from one thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence

from ..config.settings import Settings
from ..core import policy
from ..core.state import DeviceState
from ..host import inotify
from ..model import Gpu
from ..observability import readiness
from ..observability.readiness import Readiness
from ..observability.stats import Stats
from ..service.server import PluginServer, RegistrationError, register
from ..service.servicer import DevicePluginServicer
from . import dir_events
from .backoff import Backoff
from .kubelet_identity import Identity, identity
from .socket_check import socket_path_problem

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 10.0


class KubeletSession:
    def __init__(self, settings: Settings, gpus: Sequence[Gpu], state: DeviceState, stats: Stats,
                 readiness: Readiness) -> None:
        self.settings = settings
        self.gpus = gpus
        self.state = state
        self.stats = stats
        self.readiness = readiness
        self.resource = policy.resource_name(settings)
        self.server: PluginServer | None = None
        self.registered_event = threading.Event()  # set after each successful registration (tests)
        self.socket_wd: int | None = None
        self._retry = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        self._watcher: inotify.Inotify | None = None
        self._needs_resync = False
        self._registered_with: Identity | None = None  # kubelet.sock we registered through

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

    # ------------------------------------------------------------ start and stop

    def watch(self, watcher: inotify.Inotify) -> bool:
        """Watch the socket directory (made when missing); False, logged, when our socket can never be bound."""
        self._watcher = watcher
        try:
            os.makedirs(self.socket_dir, mode=0o750, exist_ok=True)
            self.socket_wd = watcher.add_watch(self.socket_dir, dir_events.DIR_EVENTS)
        except OSError as exc:
            log.error("cannot use the kubelet's socket directory %s (%s): check --kubelet-socket and that "
                      "the plugin runs as root", self.socket_dir, exc.strerror or exc)
            return False
        problem = socket_path_problem(self.socket_path)
        if problem:
            log.error("%s", problem)
            return False
        return True

    def advertise(self) -> None:
        """What we offer the kubelet: the GPUs as the current settings hand them out."""
        self.state.set_devices(policy.advertised_devices(self.gpus, self.settings))

    def start(self) -> None:
        """Serve and register, or say there is nothing to serve and wait."""
        if self.state.devices():
            if self.serve():  # on failure a retry is already scheduled
                self.try_register()
        else:
            log.warning("no GPUs to advertise: not registering %s; waiting (stop with SIGTERM)", self.resource)
            self.readiness.update(readiness.NO_GPUS)

    def close(self) -> None:
        """Stop serving and remove our socket (the kubelet then drops our devices)."""
        if self.server is not None:
            self.server.stop(remove=True)
            self.server = None
        self._watcher = None

    def switch(self, new: Settings) -> None:
        """Run with `new`; keeps the registration when the resource name stays the same."""
        old_resource = self.resource
        self.settings = new
        self.resource = policy.resource_name(new)
        self.advertise()
        log.info("configuration reloaded: %s, %d devices", self.resource, len(self.state.devices()))
        if self.resource != old_resource and self.state.devices():
            if self.server is not None:
                self.server.stop(remove=True)
                self.server = None
            if self.serve():
                self.try_register()

    # ------------------------------------------------------------ events and timers

    @property
    def retry_at(self) -> float | None:
        """When the scheduled retry is due (monotonic clock); None when none is."""
        return self._retry.due_at

    def retry_if_due(self) -> None:
        if self._retry.due():
            if self._needs_resync:
                self.resync()
            else:
                self.try_register()

    def on_events(self, seen: dir_events.Seen) -> None:
        """Act on what the socket directory's events meant."""
        if seen.resync:
            self.resync()
            return  # the re-check covers the rest
        # our socket first: the kubelet wipes it before it re-creates kubelet.sock
        if seen.endpoint_deleted and self.server is not None and not self.server.owns_socket():
            self._on_socket_lost()
        if seen.kubelet_started:
            self._on_kubelet_started()

    def resync(self) -> None:
        """Work out from the files what the lost events would have said."""
        log.warning("socket directory events were lost or the directory was removed: re-checking %s",
                    self.socket_dir)
        self._needs_resync = False
        try:
            os.makedirs(self.socket_dir, mode=0o750, exist_ok=True)
            assert self._watcher is not None
            self.socket_wd = self._watcher.add_watch(self.socket_dir, dir_events.DIR_EVENTS | inotify.IN_MASK_ADD)
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
        if (self.stats.registered or self.server is None) and not self.serve():
            return  # the old stream belonged to the old kubelet: serve afresh first (retry is scheduled)
        self.try_register()

    def _on_socket_lost(self) -> None:
        log.info("our socket %s was removed (kubelet restart?): serving again", self.socket_path)
        self._retry.reset()
        if self.serve():
            self.try_register()

    # ------------------------------------------------------------ serving and registration

    def serve(self) -> bool:
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

    def try_register(self) -> None:
        self._retry.cancel()
        # a socket deleted under us cannot be dialled back: serve afresh before registering
        if (self.server is None or not self.server.owns_socket()) and not self.serve():
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

    def _allocated(self, ids: list[str]) -> None:
        self.stats.add("allocations")
