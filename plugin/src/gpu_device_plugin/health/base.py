"""The contract of a health monitor.

A monitor watches the physical GPUs it was given and calls `report(gpu_id, health)`
whenever a GPU's health changes (Unhealthy with a reason, or Healthy again after
recovery). `report` is thread-safe and cheap; a monitor may call it from its own thread.
"""

from __future__ import annotations

import threading
import time
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


# A monitor loop that has not turned for this long is stuck; the systemd watchdog then restarts us.
STALL_LIMIT_S = 60.0


def loop_alive(started: bool, stopping: bool, thread: threading.Thread | None, last_beat: float) -> bool:
    """The liveness rule every threaded monitor shares: started, not stopping, its thread running
    and its loop turning (a driver call that never returns stops the beat)."""
    if not started or stopping:
        return False
    if thread is None:
        return True
    return time.monotonic() - last_beat <= STALL_LIMIT_S and thread.is_alive()
