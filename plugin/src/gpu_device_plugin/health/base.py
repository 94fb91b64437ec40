"""The contract of a health monitor.

A monitor watches the physical GPUs it was given and calls `report(gpu_id, health)`
whenever a GPU's health changes (Unhealthy with a reason, or Healthy again after
recovery). `report` is thread-safe and cheap; a monitor may call it from its own thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..model import Gpu, Health

Report = Callable[[str, Health], None]


class HealthMonitor(Protocol):
    def start(self, gpus: Sequence[Gpu], report: Report) -> None:
        """Begin watching; returns at once."""
        ...

    def stop(self) -> None:
        """Stop watching and release threads/files; idempotent."""
        ...

    def alive(self) -> bool:
        """False when the monitor's loop has died (the systemd watchdog stops pinging)."""
        ...
