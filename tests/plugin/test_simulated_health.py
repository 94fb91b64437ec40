"""The simulated health monitor gives back every descriptor it took, however it ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.health.simulated import SimulatedHealthMonitor
from gpu_device_plugin.host import inotify
from helpers import Reports, wait_until


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def left_open(before: set[str]) -> set[str]:
    """Descriptors open now that were not before. Not an equality: gRPC servers of earlier
    tests may still be closing theirs in the background while this test runs."""
    return open_fds() - before


def test_start_and_stop_leave_no_descriptor_behind(tmp_path: Path) -> None:
    gpus = SimulatedBackend(2).discover()
    before = open_fds()
    for _ in range(3):
        monitor = SimulatedHealthMonitor(str(tmp_path / "health"))
        reports = Reports()
        monitor.start(gpus, reports)
        (tmp_path / "health" / "sim-gpu-1").write_text("Unhealthy\n")
        assert wait_until(lambda seen=reports: (gpus[1].id, False) in seen.states())
        (tmp_path / "health" / "sim-gpu-1").unlink()
        monitor.stop()
    assert left_open(before) == set()


def test_a_monitor_never_started_holds_no_descriptor(tmp_path: Path) -> None:
    before = open_fds()
    monitor = SimulatedHealthMonitor(str(tmp_path))
    monitor.stop()
    assert left_open(before) == set()


def test_a_failed_start_closes_its_watcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: inotify.Inotify, path: str, mask: int) -> int:
        raise OSError(28, "cannot watch: No space left on device (raise fs.inotify.max_user_watches)")

    monkeypatch.setattr(inotify.Inotify, "add_watch", refuse)
    before = open_fds()
    with pytest.raises(OSError):
        SimulatedHealthMonitor(str(tmp_path)).start(SimulatedBackend(1).discover(), Reports())
    assert left_open(before) == set()
