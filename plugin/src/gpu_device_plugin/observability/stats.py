"""Counters for /metrics and the tests, bumped from gRPC, monitor and main-loop threads alike."""

import threading
import time
from typing import NamedTuple


class Counts(NamedTuple):
    """A snapshot of the counters (Stats holds the live values)."""

    registrations: int = 0
    registration_failures: int = 0
    kubelet_restarts: int = 0
    allocations: int = 0
    health_events: int = 0
    config_reloads: int = 0
    config_rejections: int = 0
    loop_wakeups: int = 0  # main-loop iterations: proves the loop sleeps when nothing happens
    registered: bool = False
    started_at: float = 0.0  # monotonic clock; Stats sets it when created
    first_registered_at: float | None = None


class Stats:
    """The counters behind a lock: `+=` on a shared value from several threads can lose updates."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = Counts(started_at=time.monotonic())._asdict()

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] = self._value(name) + amount

    def set(self, **values: object) -> None:
        with self._lock:
            unknown = [name for name in values if name not in self._values]
            if unknown:
                raise AttributeError(unknown[0])
            self._values.update(values)

    def snapshot(self) -> Counts:
        with self._lock:
            return Counts(**self._values)

    def _value(self, name: str) -> object:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getattr__(self, name: str) -> object:
        # read access as attributes (stats.registrations) for the daemon and the tests
        if name.startswith("_"):
            raise AttributeError(name)
        with self._lock:
            return self._value(name)
