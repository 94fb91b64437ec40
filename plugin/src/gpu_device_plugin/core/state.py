"""The advertised device set and its health, shared between gRPC threads and monitors.

Writers (discovery, health monitors, config reload) bump a version and call the wakers:
the gRPC server's loop then polls its ListAndWatch streams, which send the new list when
the version moved. Nothing polls on a timer, so an idle plugin uses no CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from ..model import HEALTHY, Health
from .policy import AdvertisedDevice, device_states


class DeviceState:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._devices: tuple[AdvertisedDevice, ...] = ()
        self._by_id: dict[str, AdvertisedDevice] = {}
        self._health: dict[str, Health] = {}
        self._version = 0
        self._listeners: list[Callable[[str, Health], None]] = []
        self._wakers: list[Callable[[], None]] = []  # the serving gRPC server's wake()

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

    @property
    def version(self) -> int:
        """Moves whenever the devices or their health change (a plain read: an int is atomic)."""
        return self._version

    def snapshot(self) -> tuple[int, list[tuple[str, bool, int | None]]]:
        with self._cond:
            return self._version, device_states(self._devices, self._health)

    def add_waker(self, waker: Callable[[], None]) -> None:
        with self._cond:
            self._wakers.append(waker)

    def remove_waker(self, waker: Callable[[], None]) -> None:
        with self._cond:
            if waker in self._wakers:
                self._wakers.remove(waker)

    def wake(self) -> None:
        """Have the streams look again (one was replaced, or the server stops) without a change."""
        with self._cond:
            self._notify()

    def _bump(self) -> None:
        self._version += 1
        self._notify()

    def _notify(self) -> None:  # under the lock; a waker only writes a byte to a pipe
        self._cond.notify_all()
        for waker in self._wakers:
            waker()
