"""Health of Thor's iGPU on NVIDIA's open driver (OpenRM): its Xid lines in the kernel log judged like a
dGPU's, lines of another GPU or of nvgpu left alone, device nodes watched, recovery after a quiet period.
The monitor runs on a copy of the Thor fixture tree with a kernel log stand-in the test appends to."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.health.rules import XidPolicy, xid_policy_from_env
from gpu_device_plugin.health.tegra import (
    NVGPU,
    NVRM,
    GpuLogError,
    TegraHealthMonitor,
    check_device_node,
    classify_kmsg_line,
    concerns,
    kmsg_observation,
)
from gpu_device_plugin.model import Gpu
from helpers import Reports, wait_until

FIXTURES = Path(__file__).parent / "fixtures"
THOR = FIXTURES / "jetson-agx-thor-r39"
ORIN_NANO = FIXTURES / "jetson-orin-nano-r39"


def nvrm_xid(xid: int, text: str, bus: str = "0000:01:00", pid: str = "2417, name=python3") -> str:
    """A /dev/kmsg record as the open driver's kernel_rc.c prints an Xid."""
    return f"3,4101,912345678,-;NVRM: Xid (PCI:{bus}): {xid}, pid={pid}, {text}"


def discover(root: Path) -> Gpu:
    (gpu,) = TegraBackend(str(root)).discover()
    return gpu


# -- classification (pure) --------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    (nvrm_xid(79, "GPU has fallen off the bus."), GpuLogError(79, "Xid 79", NVRM, "0000:01:00")),
    (nvrm_xid(13, "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Illegal Instruction Encoding"),
     GpuLogError(13, "Xid 13", NVRM, "0000:01:00")),
    (nvrm_xid(109, "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005", pid="'<unknown>', name=<unknown>"),
     GpuLogError(109, "Xid 109", NVRM, "0000:01:00")),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:02 GPU-CI:00): 43, pid=17, name=worker, Ch 00000010",
     GpuLogError(43, "Xid 43", NVRM, "0000:01:00")),
    ("NVRM: Xid (PCI:0000:3B:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
     GpuLogError(48, "Xid 48", NVRM, "0000:3b:00")),
    ("4,88,99,-;NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:1000)",
     GpuLogError(None, "the NVIDIA driver could not initialise the GPU (RmInitAdapter failed)", NVRM, "0000:01:00")),
    ("3,89,99,-;NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
     GpuLogError(None, "the GPU has fallen off the bus", NVRM, "0000:01:00")),
])
def test_the_open_drivers_error_lines_are_classified(line: str, expected: GpuLogError) -> None:
    assert classify_kmsg_line(line) == expected


@pytest.mark.parametrize("line", [
    "4,90,99,-;NVRM: GPU at PCI:0000:01:00: GPU-8d1b4c52-6e0a-5f3b-b7d4-2f9e61a0c3d8",  # logged once before an Xid
    "6,91,99,-;NVRM: loading NVIDIA UNIX Open Kernel Module for aarch64  595.78  Release Build",
    "4,92,99,-;NVRM: GPU 0000:01:00.0: RmInitAdapter succeeded",
    "6,93,99,-;nvidia-modeset: Loading NVIDIA UNIX Open Kernel Mode Setting Driver for aarch64  595.78",
])
def test_the_open_drivers_other_lines_are_not_errors(line: str) -> None:
    assert classify_kmsg_line(line) is None


@pytest.mark.parametrize(("env", "xid", "counts"), [
    ({}, 79, True),
    ({}, 48, True),
    ({}, 119, True),
    ({}, 13, False),  # an application's fault, as for a dGPU
    ({}, 31, False),
    ({}, 43, False),
    ({"DP_ENABLE_HEALTHCHECKS": "13"}, 13, True),
    ({"DP_DISABLE_HEALTHCHECKS": "79"}, 79, False),
    ({"DP_DISABLE_HEALTHCHECKS": "all"}, 79, False),
])
def test_thors_xids_follow_the_same_policy_as_a_dgpus(env: dict[str, str], xid: int, counts: bool) -> None:
    observation = kmsg_observation(nvrm_xid(xid, "some text"), xid_policy_from_env(env))
    assert (observation is not None) == counts
    if observation is not None:
        assert observation.reason.startswith(f"NVIDIA driver error in the kernel log: Xid {xid}: NVRM: Xid")


def test_an_error_line_concerns_the_gpu_its_driver_runs() -> None:
    thor, orin = discover(THOR), discover(ORIN_NANO)
    own = classify_kmsg_line(nvrm_xid(79, "GPU has fallen off the bus."))
    other = classify_kmsg_line(nvrm_xid(79, "GPU has fallen off the bus.", bus="0000:03:00"))
    nvgpu = classify_kmsg_line("3,1,2,-;nvgpu: 17000000.gpu nvgpu_sw_quiesce_thread:1134 [ERR]  SW quiesce done")
    assert own is not None and other is not None and nvgpu is not None and nvgpu.source == NVGPU
    assert concerns(own, thor) and not concerns(other, thor)  # a dGPU beside Thor logs its own Xids
    assert concerns(nvgpu, orin) and not concerns(nvgpu, thor)
    assert not concerns(own, orin)  # Orin's display also runs on nvidia.ko: its NVRM lines are no GPU fault


def test_of_thors_nodes_only_the_control_nodes_are_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real_open = os.open

    def spy(path: str, flags: int, *args: int) -> int:
        opened.append(os.path.basename(str(path)))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", spy)
    for node in discover(THOR).device_nodes:
        assert check_device_node(str(THOR) + node, node) is None
    assert sorted(opened) == ["nvidiactl", "nvmap"]  # opening /dev/nvidia0 would bring the GPU up


# -- the monitor on a Thor tree ----------------------------------------------------------------


@pytest.fixture
def thor_board(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    root = tmp_path / "root"
    shutil.copytree(THOR, root, symlinks=True)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    yield root, kmsg


def append(kmsg: Path, *lines: str) -> None:
    with open(kmsg, "a") as f:
        f.write("".join(line + "\n" for line in lines))


def test_thor_goes_unhealthy_on_a_critical_xid_of_its_own_and_recovers(thor_board: tuple[Path, Path]) -> None:
    root, kmsg = thor_board
    monitor = TegraHealthMonitor(str(root), str(kmsg), env={}, recovery_quiet_period_s=0.2,
                                 recheck_interval_s=0.05, file_poll_interval_s=0.02)
    reports = Reports()
    monitor.start([discover(root)], reports)
    try:
        # an application's Xid and a dGPU's critical one come first and change nothing: the first
        # report is the line after them
        append(kmsg, nvrm_xid(13, "Graphics SM Warp Exception"),
               nvrm_xid(79, "GPU has fallen off the bus.", bus="0000:03:00"),
               nvrm_xid(119, "Timeout after 6s of waiting for RPC response from GPU0 GSP!"))
        assert wait_until(lambda: len(reports.calls) >= 1), "no report after Thor's own Xid 119"
        gpu_id, health = reports.calls[0]
        assert gpu_id == "tegra-t264-igpu0" and not health.healthy
        assert "Xid 119" in health.reason and "PCI:0000:01:00" in health.reason
        assert wait_until(lambda: len(reports.calls) >= 2), "no recovery after the quiet period"
        assert reports.healthy_flags() == [False, True]
    finally:
        monitor.stop()


def test_thor_goes_unhealthy_when_its_gpu_node_goes_and_recovers(thor_board: tuple[Path, Path]) -> None:
    root, kmsg = thor_board
    monitor = TegraHealthMonitor(str(root), str(kmsg), env={}, recovery_quiet_period_s=0.2,
                                 recheck_interval_s=0.05, file_poll_interval_s=0.02)
    reports = Reports()
    monitor.start([discover(root)], reports)
    try:
        (root / "dev/nvidia0").unlink()
        assert wait_until(lambda: len(reports.calls) >= 1)
        assert "/dev/nvidia0 is missing" in reports.calls[0][1].reason
        (root / "dev/nvidia0").write_text("")
        assert wait_until(lambda: len(reports.calls) >= 2)
        assert reports.healthy_flags() == [False, True]
    finally:
        monitor.stop()


def test_health_checks_off_ignore_thors_xids_too() -> None:
    policy = XidPolicy(disabled=True)
    assert kmsg_observation(nvrm_xid(79, "GPU has fallen off the bus."), policy) is None
    assert kmsg_observation("NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:1000)", policy) is None
