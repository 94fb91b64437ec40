"""An NVSwitch board's GPUs are unhealthy while Fabric Manager is down or their NVLink fabric is not set up
(CUDA fails with 802 there), and healthy again once it is; no other board is affected.

The monitor runs against the fake NVML (nvidia-ml-py's names, its fabric structures passed by byref as
pynvml's callers do) and a host tree with /proc/driver/nvidia-nvswitch and /proc/<pid>/comm."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_nvml import (
    NVML_GPU_FABRIC_STATE_COMPLETED,
    NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    NVML_GPU_FABRIC_STATE_NOT_STARTED,
    FakeNvml,
    make_gpus,
)
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.doctor.nvidia_stack import evaluate_datacentre
from gpu_device_plugin.doctor.report import FAIL, PASS
from gpu_device_plugin.health import fabric
from gpu_device_plugin.health.nvml import NvmlHealthMonitor
from gpu_device_plugin.model import Gpu
from helpers import Reports, wait_until

QUIET_S = 60.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def board(tmp_path: Path, nvswitch: bool = True) -> Path:
    root = tmp_path / "host"
    (root / "proc").mkdir(parents=True)
    if nvswitch:  # what nvidia.ko lists for each NVSwitch it drives
        (root / "proc/driver/nvidia-nvswitch/devices/0000:07:00.0").mkdir(parents=True)
    return root


def start_fabric_manager(root: Path, pid: int = 4242) -> None:
    (root / f"proc/{pid}").mkdir()
    (root / f"proc/{pid}/comm").write_text("nv-fabricmanage\n")  # comm keeps 15 characters


def stop_fabric_manager(root: Path, pid: int = 4242) -> None:
    (root / f"proc/{pid}/comm").unlink()
    (root / f"proc/{pid}").rmdir()


@pytest.fixture
def monitor() -> Iterator[Callable[..., tuple[Reports, list[Gpu], FakeClock]]]:
    started: list[NvmlHealthMonitor] = []

    def start(nvml: FakeNvml, root: Path) -> tuple[Reports, list[Gpu], FakeClock]:
        clock = FakeClock()
        gpus = NvmlBackend("/nonexistent", nvml).discover()
        running = NvmlHealthMonitor(nvml, env={}, clock=clock, root=str(root), wait_timeout_ms=10,
                                    idle_wait_ms=10, check_interval_s=1.0, recovery_quiet_period_s=QUIET_S)
        reports = Reports()
        running.start(gpus, reports)
        started.append(running)
        return reports, gpus, clock

    yield start
    for running in started:
        running.stop()


def unhealthy(reports: Reports, gpus: list[Gpu]) -> dict[str, str]:
    latest = {gpu_id: health for gpu_id, health in reports.calls}
    return {g.id: latest[g.id].reason for g in gpus if g.id in latest and not latest[g.id].healthy}


def test_fabric_manager_down_on_an_a100_nvswitch_board_marks_every_gpu_unhealthy_until_it_runs(
        tmp_path: Path, monitor) -> None:
    root = board(tmp_path)
    nvml = FakeNvml(make_gpus(2))  # A100: NVML has no fabric state for it
    reports, gpus, clock = monitor(nvml, root)
    assert wait_until(lambda: len(unhealthy(reports, gpus)) == 2), reports.calls
    for reason in unhealthy(reports, gpus).values():
        assert "Fabric Manager is not running" in reason and "802" in reason
    start_fabric_manager(root)
    clock.now += QUIET_S + 1
    assert wait_until(lambda: reports.healthy_flags()[-2:] == [True, True]), reports.calls
    assert unhealthy(reports, gpus) == {}
    # and down again: the remembered pid is gone
    stop_fabric_manager(root)
    clock.now += 2
    assert wait_until(lambda: len(unhealthy(reports, gpus)) == 2), reports.calls


@pytest.mark.parametrize("has_versioned_call", [True, False])
def test_a_hopper_gpu_whose_fabric_is_not_set_up_is_unhealthy_until_it_is(
        tmp_path: Path, monitor, has_versioned_call: bool) -> None:
    root = board(tmp_path)
    start_fabric_manager(root)
    nvml = FakeNvml(make_gpus(2, name="NVIDIA H100 80GB HBM3", fabric_state=NVML_GPU_FABRIC_STATE_COMPLETED),
                    has_fabric_info_v=has_versioned_call)
    nvml.gpus[1].fabric_state = NVML_GPU_FABRIC_STATE_IN_PROGRESS
    reports, gpus, clock = monitor(nvml, root)
    assert wait_until(lambda: gpus[1].id in unhealthy(reports, gpus)), reports.calls
    assert "NVLink fabric is in progress" in unhealthy(reports, gpus)[gpus[1].id]
    assert gpus[0].id not in unhealthy(reports, gpus)
    nvml.gpus[1].fabric_state = NVML_GPU_FABRIC_STATE_COMPLETED
    clock.now += QUIET_S + 1
    assert wait_until(lambda: reports.states()[-1] == (gpus[1].id, True)), reports.calls


def test_a_board_without_an_nvswitch_is_not_affected(tmp_path: Path, monitor) -> None:
    root = board(tmp_path, nvswitch=False)  # no Fabric Manager either, and a GPU that would say "not started"
    nvml = FakeNvml(make_gpus(2, fabric_state=NVML_GPU_FABRIC_STATE_NOT_STARTED))
    reports, gpus, clock = monitor(nvml, root)
    for _ in range(3):
        target = nvml.wait_calls + 3
        assert wait_until(lambda t=target: nvml.wait_calls >= t)
        clock.now += 2
    assert reports.calls == [] and nvml.fabric_calls == 0


@pytest.mark.parametrize(("running", "state", "words"), [
    (False, None, "Fabric Manager is not running"),
    (False, (NVML_GPU_FABRIC_STATE_COMPLETED, 0), "Fabric Manager is not running"),
    (True, (NVML_GPU_FABRIC_STATE_NOT_STARTED, 0), "NVLink fabric is not started"),
    (True, (NVML_GPU_FABRIC_STATE_COMPLETED, 999), "failed to come up (NVML status 999)"),
])
def test_the_fabric_rules(running: bool, state: tuple[int, int] | None, words: str) -> None:
    observation = fabric.classify(running, state)
    assert not observation.ok and words in observation.reason
    assert fabric.classify(True, None).ok and fabric.classify(True, (NVML_GPU_FABRIC_STATE_COMPLETED, 0)).ok


def test_the_check_and_the_monitor_look_for_the_same_process(tmp_path: Path) -> None:
    root = board(tmp_path)
    watch = fabric.FabricManagerWatch(str(root))
    assert not watch.running()
    start_fabric_manager(root)
    assert watch.running()
    gpus = NvmlBackend("/nonexistent", FakeNvml(make_gpus(1))).discover()
    check = evaluate_datacentre("nvml", gpus, fabric.nvswitches(str(root)), {fabric.FABRICMANAGER_COMM,
                                                                            "nvidia-persiste"}, True, False)
    assert check.status == PASS
    assert evaluate_datacentre("nvml", gpus, fabric.nvswitches(str(root)), {"nvidia-persiste"}, True,
                               False).status == FAIL
