"""The advertised device set and its health, shared between gRPC threads and monitors.

Writers (discovery, health monitors, config reload) bump a version; ListAndWatch streams
sleep on a condition until the version moves, so an idle plugin uses no CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from .model import HEALTHY, Health
from .policy import AdvertisedDevice, device_states


class DeviceState:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._devices: tuple[AdvertisedDevice, ...] = ()
        self._by_id: dict[str, AdvertisedDevice] = {}
        self._health: dict[str, Health] = {}
        self._version = 0
        self._wakes = 0  # bumped by wake(): a waiter leaves even when the devices did not change
        self._listeners: list[Callable[[str, Health], None]] = []

    def set_devices(self, devices: Sequence[AdvertisedDevice]) -> None:
        with self._cond:
            self._devices = tuple(devices)
            self._by_id = {d.id: d for d in devices}
            self._bump()

    def devices(self) -> tuple[AdvertisedDevice, ...]:
        with self._cond:
            return self._devices

    def by_id(self) -> Mapping[str, AdvertisedDevice]:
        with self._cond:
            return self._by_id

    def on_health_change(self, listener: Callable[[str, Health], None]) -> None:
        self._listeners.append(listener)

    def report_health(self, gpu_id: str, health: Health) -> bool:
        """Record a physical GPU's health; True when it changed (and streams were woken)."""
        with self._cond:
            if self._health.get(gpu_id, HEALTHY).healthy == health.healthy:
                self._health[gpu_id] = health
                return False
            self._health[gpu_id] = health
            self._bump()
        for listener in self._listeners:
            listener(gpu_id, health)
        return True

    def snapshot(self) -> tuple[int, list[tuple[str, bool, int | None]]]:
        with self._cond:
            return self._version, device_states(self._devices, self._health)

    def wake_token(self) -> int:
        """Take this before checking whether to keep waiting; a wake() after it ends the wait."""
        with self._cond:
            return self._wakes

    def wait_for_change(self, seen_version: int, token: int, timeout: float | None = None) -> bool:
        """Block until the version differs from `seen_version` or wake() ran since `token` was taken."""
        with self._cond:
            return self._cond.wait_for(lambda: self._version != seen_version or self._wakes != token, timeout)

    def wake(self) -> None:
        """Wake all waiters (a stream whose RPC ended re-checks and leaves)."""
        with self._cond:
            self._wakes += 1
            self._cond.notify_all()

    def _bump(self) -> None:
        self._version += 1
        self._cond.notify_all()
