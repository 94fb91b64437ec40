"""What systemd (and /healthz) hear about the session: READY once it is up, then STATUS lines.

READY=1 goes out as soon as the plugin serves on its socket (or knows it has nothing to
serve), never only after a registration: a node whose kubelet is not running yet, such as
an agent not yet pointed at a server, must still finish booting. What the plugin waits
for stays visible in `systemctl status` (STATUS=) and in /healthz.
"""

from __future__ import annotations

import threading

from . import sdnotify


def waiting_for_kubelet(kubelet_socket: str) -> str:
    return f"serving; waiting for the kubelet at {kubelet_socket}"


def registered(devices: int, resource: str, kubelet_socket: str) -> str:
    return f"registered {devices} devices as {resource} with the kubelet at {kubelet_socket}"


def retrying(what: str, delay: float) -> str:
    return f"{what}; retrying in {delay:.2f}s"


NO_GPUS = "no GPUs on this node; nothing registered"


class Readiness:
    def __init__(self, environ: dict[str, str]) -> None:
        self._environ = environ
        self._lock = threading.Lock()
        self._ready = False
        self._status = "starting"

    @property
    def status(self) -> str:
        with self._lock:
            return self._status

    def update(self, status: str) -> None:
        """The session's state in one line; told to systemd at once once READY went out."""
        with self._lock:
            changed = status != self._status
            self._status = status
            ready = self._ready
        if ready and changed:
            sdnotify.notify(f"STATUS={status}", self._environ)

    def ready(self) -> None:
        """READY=1 with the current status; only the first call sends it."""
        with self._lock:
            if self._ready:
                return
            self._ready = True
            status = self._status
        sdnotify.notify(f"READY=1\nSTATUS={status}", self._environ)

    def stopping(self) -> None:
        with self._lock:
            self._status = "stopping"
        sdnotify.notify("STOPPING=1\nSTATUS=stopping", self._environ)
