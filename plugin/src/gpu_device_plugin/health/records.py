"""Each GPU's health record behind one lock, reporting only a change: shared by the threaded monitors."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from ..model import Health
from .base import Report
from .rules import HealthRecord, Observation, next_state

log = logging.getLogger(__name__)


class HealthRecords:
    def __init__(self, clock: Callable[[], float], quiet_period_s: float, recovered_when: str) -> None:
        self._clock = clock
        self._quiet_period_s = quiet_period_s
        self._recovered_when = recovered_when  # for the debug line, e.g. "it answered NVML normally"
        self._lock = threading.Lock()
        self._records: dict[str, HealthRecord] = {}
        self._report: Report = lambda gpu_id, health: None

    def start(self, gpu_ids: Iterable[str], report: Report) -> None:
        with self._lock:
            self._records = {gpu_id: HealthRecord() for gpu_id in gpu_ids}
        self._report = report

    def healthy(self, gpu_id: str) -> bool:
        with self._lock:
            return self._records[gpu_id].healthy

    def all_healthy(self) -> bool:
        with self._lock:
            return all(record.healthy for record in self._records.values())

    def observe(self, gpu_id: str, observation: Observation) -> None:
        """Apply the recovery rule; report the GPU's health when it flips (the daemon logs the change)."""
        with self._lock:
            old = self._records[gpu_id]
            new = next_state(old, observation, self._clock(), self._quiet_period_s)
            self._records[gpu_id] = new
        if new.healthy == old.healthy:
            return
        if new.healthy:
            log.debug("GPU %s is Healthy again: %s for %.0f s", gpu_id, self._recovered_when, self._quiet_period_s)
        else:
            log.debug("GPU %s is Unhealthy: %s", gpu_id, new.reason)
        self._report(gpu_id, Health(new.healthy, new.reason))


class LastXids:
    """The last Xid each watched GPU reported, for telemetry (DCGM_FI_DEV_XID_ERRORS): 0 until
    one comes, None for a GPU nobody watches, so a metric is never made up. Every Xid counts,
    the application errors the health rules ignore included, as DCGM reports them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: set[str] = set()
        self._last: dict[str, int] = {}

    def watch(self, gpu_ids: Iterable[str]) -> None:
        with self._lock:
            self._watched = set(gpu_ids)

    def seen(self, gpu_id: str, xid: int) -> None:
        with self._lock:
            self._last[gpu_id] = xid

    def last(self, gpu_id: str) -> int | None:
        with self._lock:
            return self._last.get(gpu_id, 0) if gpu_id in self._watched else None
