"""DCGM_FI_DEV_XID_ERRORS comes from what the health monitors already see: nvgpu's channel
errors in a Jetson's kernel log, NVML's Xid events on discrete GPUs. Every Xid counts, the
application errors the health rules ignore included; a GPU nobody watches has none (None)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_nvml import FakeNvml, make_gpus
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.health.nvml import NvmlHealthMonitor
from gpu_device_plugin.health.records import LastXids
from gpu_device_plugin.health.tegra import TegraHealthMonitor
from gpu_device_plugin.model import Gpu
from helpers import Reports, wait_until

NODE = "/dev/nvhost-ctrl-gpu"
GPU = Gpu(id="tegra-t210-igpu0", index=0, name="Tegra X1 (T210)", backend="tegra", device_nodes=(NODE,))


def nvgpu_error(text: str) -> str:
    return f"3,1234,5678901,-;nvgpu: 57000000.gpu {'nvgpu_set_error_notifier_locked':>33}:1556 [ERR]  {text}\n"


@pytest.fixture
def board(tmp_path: Path) -> Path:
    (tmp_path / "root" / "dev").mkdir(parents=True)
    (tmp_path / "root" / NODE.lstrip("/")).write_text("")
    (tmp_path / "kmsg").write_text("")
    return tmp_path


@pytest.fixture
def monitors() -> Iterator[list]:
    started: list = []
    yield started
    for monitor in started:
        monitor.stop()


def test_last_xids_are_zero_until_one_comes_and_none_for_an_unwatched_gpu() -> None:
    xids = LastXids()
    assert xids.last("a") is None
    xids.watch(["a"])
    assert (xids.last("a"), xids.last("b")) == (0, None)
    xids.seen("a", 31)
    assert xids.last("a") == 31
    xids.watch(())
    assert xids.last("a") is None


def test_tegra_channel_error_sets_the_xid_even_one_the_health_rules_ignore(board: Path, monitors: list) -> None:
    reports = Reports()
    monitor = TegraHealthMonitor(str(board / "root"), str(board / "kmsg"), env={}, file_poll_interval_s=0.01)
    monitors.append(monitor)
    monitor.start([GPU], reports)
    assert monitor.last_xid(GPU.id) == 0
    with open(board / "kmsg", "a") as kmsg:
        kmsg.write(nvgpu_error("error notifier set to 31 for ch 507"))  # an MMU fault: the application's
    assert wait_until(lambda: monitor.last_xid(GPU.id) == 31), monitor.last_xid(GPU.id)
    assert reports.calls == []  # still healthy: Xid 31 is an application error
    with open(board / "kmsg", "a") as kmsg:
        kmsg.write(nvgpu_error("error notifier set to 8 for ch 12"))
    assert wait_until(lambda: monitor.last_xid(GPU.id) == 8)


def test_tegra_without_a_readable_kernel_log_has_no_xid(board: Path, monitors: list) -> None:
    monitor = TegraHealthMonitor(str(board / "root"), str(board / "no-kmsg"), env={})
    monitors.append(monitor)
    monitor.start([GPU], Reports())
    assert monitor.last_xid(GPU.id) is None


def test_tegra_with_health_checks_disabled_has_no_xid(board: Path, monitors: list) -> None:
    monitor = TegraHealthMonitor(str(board / "root"), str(board / "kmsg"), env={"DP_DISABLE_HEALTHCHECKS": "all"})
    monitors.append(monitor)
    monitor.start([GPU], Reports())
    assert monitor.last_xid(GPU.id) is None


def test_nvml_xid_events_set_the_xid_of_their_gpu_only(monitors: list) -> None:
    nvml = FakeNvml(make_gpus(2))
    gpus = NvmlBackend(nvml_module=nvml).discover()
    reports = Reports()
    monitor = NvmlHealthMonitor(nvml, env={}, wait_timeout_ms=20, idle_wait_ms=20)
    monitors.append(monitor)
    monitor.start(gpus, reports)
    first, second = (gpu.id for gpu in gpus)
    assert wait_until(lambda: monitor.last_xid(first) == 0 and monitor.last_xid(second) == 0)
    nvml.emit_xid(first, 43)  # an application error: ignored for health, still the last Xid
    assert wait_until(lambda: monitor.last_xid(first) == 43)
    assert monitor.last_xid(second) == 0 and reports.calls == []
    nvml.emit_xid(second, 79)
    assert wait_until(lambda: monitor.last_xid(second) == 79)
    assert wait_until(lambda: reports.states() == [(second, False)])


def test_nvml_gpu_without_xid_events_has_no_xid(monitors: list) -> None:
    nvml = FakeNvml(make_gpus(2))
    nvml.gpus[1].supported_events = 0
    gpus = NvmlBackend(nvml_module=nvml).discover()
    monitor = NvmlHealthMonitor(nvml, env={}, wait_timeout_ms=20, idle_wait_ms=20)
    monitors.append(monitor)
    monitor.start(gpus, Reports())
    assert wait_until(lambda: monitor.last_xid(gpus[0].id) == 0)
    assert monitor.last_xid(gpus[1].id) is None
