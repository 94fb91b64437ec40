"""Counters for /metrics and the tests, bumped from gRPC, monitor and main-loop threads alike."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace


@dataclass
class Counts:
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


class Stats:
    """`Counts` behind a lock: `+=` on a shared attribute from several threads can lose updates."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = Counts()

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self._counts, name, getattr(self._counts, name) + amount)

    def set(self, **values: object) -> None:
        with self._lock:
            for name, value in values.items():
                if not hasattr(self._counts, name):
                    raise AttributeError(name)
                setattr(self._counts, name, value)

    def snapshot(self) -> Counts:
        with self._lock:
            return replace(self._counts)

    def __getattr__(self, name: str) -> object:
        # read access as attributes (stats.registrations) for the daemon and the tests
        if name.startswith("_"):
            raise AttributeError(name)
        with self._lock:
            return getattr(self._counts, name)
