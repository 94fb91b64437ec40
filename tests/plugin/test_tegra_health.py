"""Tegra health: kernel log classification (pure), device node checks, and the monitor thread
on a fixture tree with a kmsg stand-in (a file the test appends to, or a FIFO)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gpu_device_plugin.health import tegra
from gpu_device_plugin.health.rules import XidPolicy, xid_policy_from_env
from gpu_device_plugin.health.tegra import (
    GpuLogError,
    TegraHealthMonitor,
    check_device_node,
    classify_kmsg_line,
    kmsg_observation,
    parse_kmsg_record,
)
from gpu_device_plugin.model import Gpu, Health
from helpers import Reports

NANO = "57000000.gpu"


def nvgpu(function: str, text: str, tag: str = "ERR", prio: int = 3) -> str:
    """A /dev/kmsg record as nvgpu's logger writes it (function name right-aligned in 33 columns)."""
    return f"{prio},1234,5678901,-;nvgpu: {NANO} {function:>33}:{1556:<4} [{tag}]  {text}"


# -- classification (pure) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (nvgpu("nvgpu_set_error_notifier_locked", "error notifier set to 8 for ch 507"), 8),
        (nvgpu("nvgpu_set_err_notifier_locked",
               "error notifier set to 13 for ch 508 owned by gpu-channel-hel"), 13),
        (nvgpu("gk20a_channel_timeout_handler", "Job on channel 507 timed out"), 8),
        (nvgpu("gk20a_fifo_handle_pbdma_intr_0", "pbdma_intr_0(0):0x00040000 PBH: 20000000 SHADOW: 00000000"),
         32),
        (nvgpu("gk20a_fifo_handle_mmu_fault_locked", "mmu fault on engine 0, engine subid 0 (gpc), client 1"),
         31),
        (nvgpu("ga10b_gr_intr_check_gr_mme_fe1_exception", "mme_fe1 exception: esr 0x80020000, info 0x0"),
         13),
        (nvgpu("gk20a_fifo_handle_sched_error", "fifo sched ctxsw timeout error: engine=0, tsg=4, ms=3100"),
         109),
        (nvgpu("gk20a_fifo_preempt_timeout_rc_tsg", "preempt TSG 3 timeout"), 109),
        ("3,20,30,-;gk20a 57000000.gpu: gk20a_fifo_handle_sched_error: fifo sched ctxsw timeout error:"
         "engine = 0, ch = 3", 109),
    ],
)
def test_channel_errors_carry_their_xid_equivalent(line: str, expected: int) -> None:
    found = classify_kmsg_line(line)
    assert found is not None and found.xid == expected, f"{line!r} -> {found}"


@pytest.mark.parametrize(
    "line",
    [
        nvgpu("gk20a_pmu_isr", "pmu halt intr not implemented"),
        nvgpu("nvgpu_sw_quiesce_thread", "SW quiesce thread running"),
        nvgpu("gk20a_gr_handle_fecs_error", "fecs watchdog triggered for channel 3, cannot ctxsw anymore !!"),
        nvgpu("gk20a_pm_finalize_poweron", "failed to power on gpu"),
        nvgpu("gv11b_ltc_intr", "ltc:0 lts:1 uncorrected ecc error"),
    ],
)
def test_driver_level_failures_have_no_xid_and_always_count(line: str) -> None:
    found = classify_kmsg_line(line)
    assert found is not None and found.xid is None, f"{line!r} -> {found}"
    assert kmsg_observation(line, XidPolicy()) is not None


@pytest.mark.parametrize(
    "line",
    [
        nvgpu("gk20a_fifo_handle_sched_error", "fifo is waiting for ctx switch for 100 ms, ch = 3", tag="WRN",
              prio=4),
        nvgpu("nvgpu_set_err_notifier_locked", "error notifier set to 43 for ch 3", tag="INFO", prio=6),
        nvgpu("gk20a_fifo_handle_mmu_fault_locked", "fake mmu fault on engine 0, engine subid 0 (gpc)"),
        nvgpu("gk20a_something_new", "a message this classifier does not know"),
        "3,40,50,-;__gpu__ Channel Status - chip gm20b",
        "3,41,51,-;mmc0: error -110 whilst initialising SD card",
        "6,42,52,-;usb 1-2: new high-speed USB device number 3 using tegra-xusb",
        "4,43,53,-;gk20a 57000000.gpu: gk20a_fifo_handle_sched_error: fifo sched ctxsw timeout error",
        "",
    ],
)
def test_noise_lines_are_not_gpu_errors(line: str) -> None:
    assert classify_kmsg_line(line) is None


def test_plain_lines_without_a_kmsg_prefix_are_classified_too() -> None:
    line = f"nvgpu: {NANO} gk20a_channel_timeout_handler:1556 [ERR]  Job on channel 507 timed out"
    assert classify_kmsg_line(line) == GpuLogError(8, "channel watchdog timeout")


def test_kmsg_record_gives_level_and_text_and_drops_continuation_lines() -> None:
    record = parse_kmsg_record("11,99,1234,-;nvgpu: oops\n SUBSYSTEM=platform\n DEVICE=+platform:gpu\n")
    assert (record.level, record.text) == (3, "nvgpu: oops")


@pytest.mark.parametrize(
    ("env", "notifier", "counts"),
    [
        ({}, 8, True),
        ({}, 13, False),
        ({}, 31, False),
        ({}, 32, True),
        ({"DP_ENABLE_HEALTHCHECKS": "13"}, 13, True),
        ({"DP_DISABLE_HEALTHCHECKS": "8"}, 8, False),
        ({"DP_DISABLE_HEALTHCHECKS": "all"}, 8, False),
    ],
)
def test_error_notifier_codes_follow_the_xid_policy(env: dict[str, str], notifier: int, counts: bool) -> None:
    line = nvgpu("nvgpu_set_error_notifier_locked", f"error notifier set to {notifier} for ch 507")
    observation = kmsg_observation(line, xid_policy_from_env(env))
    assert (observation is not None) == counts
    if observation is not None:
        assert f"Xid-equivalent {notifier}" in observation.reason and "ch 507" in observation.reason


def test_driver_level_failures_are_off_when_health_checks_are_disabled() -> None:
    policy = xid_policy_from_env({"DP_DISABLE_HEALTHCHECKS": "all"})
    assert kmsg_observation(nvgpu("gk20a_pmu_isr", "pmu halt intr not implemented"), policy) is None


# -- device node checks ---------------------------------------------------------------------


def test_present_node_has_no_problem_and_missing_node_is_named(tmp_path: Path) -> None:
    (tmp_path / "nvmap").write_text("")
    assert check_device_node(str(tmp_path / "nvmap"), "/dev/nvmap") is None
    assert check_device_node(str(tmp_path / "gone"), "/dev/nvhost-ctrl-gpu") == (
        "device node /dev/nvhost-ctrl-gpu is missing"
    )


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (errno.EACCES, "permission denied"),
        (errno.EPERM, "permission denied"),
        (errno.ENXIO, "no device behind it"),
        (errno.ENODEV, "no device behind it"),
        (errno.EIO, "Input/output error"),
    ],
)
def test_node_that_cannot_be_opened_is_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int, expected: str
) -> None:
    (tmp_path / "ctrl").write_text("")

    def failing_open(path: str, flags: int, *args: int) -> int:
        raise OSError(error, os.strerror(error), path)

    monkeypatch.setattr(tegra.os, "open", failing_open)
    problem = check_device_node(str(tmp_path / "ctrl"), "/dev/nvgpu/igpu0/ctrl")
    assert problem is not None and expected in problem and "/dev/nvgpu/igpu0/ctrl" in problem


def test_busy_node_counts_as_working(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ctrl").write_text("")

    def busy_open(path: str, flags: int, *args: int) -> int:
        raise OSError(errno.EBUSY, "busy", path)

    monkeypatch.setattr(tegra.os, "open", busy_open)
    assert check_device_node(str(tmp_path / "ctrl"), "/dev/nvgpu/igpu0/ctrl") is None


def test_only_control_nodes_are_opened_session_and_engine_nodes_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real_open = os.open

    def recording_open(path: str, flags: int, *args: int) -> int:
        opened.append(os.path.basename(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(tegra.os, "open", recording_open)
    shown = ("/dev/nvhost-gpu", "/dev/nvhost-as-gpu", "/dev/nvhost-dbg-gpu", "/dev/nvhost-vic",
             "/dev/nvhost-ctrl-gpu", "/dev/nvhost-ctrl", "/dev/nvmap",
             "/dev/nvgpu/igpu0/channel", "/dev/nvgpu/igpu0/ctrl")
    for node in shown:
        host = tmp_path / node.lstrip("/")
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_text("")
        assert check_device_node(str(host), node) is None
    assert sorted(opened) == ["ctrl", "nvhost-ctrl", "nvhost-ctrl-gpu", "nvmap"]


# -- the monitor thread -----------------------------------------------------------------------

NODES = ("/dev/nvhost-ctrl-gpu", "/dev/nvhost-gpu", "/dev/nvmap", "/dev/nvgpu/igpu0/ctrl")




def wait_for(condition: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> float:
    """Wait until `condition()`; returns the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)
    return time.monotonic() - started


@pytest.fixture
def board(tmp_path: Path) -> Path:
    """A fixture root with the Nano's GPU nodes as plain files and an empty kmsg stand-in."""
    root = tmp_path / "root"
    for node in NODES:
        path = root / node.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    (tmp_path / "kmsg").write_text("")
    return root


def _gpu() -> Gpu:
    return Gpu(id="tegra-gm20b-0", index=0, name="Tegra X1 (T210)", backend="tegra", device_nodes=NODES)


@pytest.fixture
def start_monitor(board: Path) -> Iterator[Callable[..., tuple[TegraHealthMonitor, Reports]]]:
    monitors: list[TegraHealthMonitor] = []

    def start(kmsg: Path | None = None, env: dict[str, str] | None = None,
              **kwargs: float) -> tuple[TegraHealthMonitor, Reports]:
        options = {"recovery_quiet_period_s": 0.3, "recheck_interval_s": 30.0, "file_poll_interval_s": 0.02,
                   **kwargs}
        kmsg_path = str(kmsg if kmsg is not None else board.parent / "kmsg")
        monitor = TegraHealthMonitor(str(board), kmsg_path, env=env or {}, **options)
        reports = Reports()
        monitor.start([_gpu()], reports)
        monitors.append(monitor)
        return monitor, reports

    yield start
    for monitor in monitors:
        monitor.stop()


def _append(path: Path, *lines: str) -> None:
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines))


def test_deleted_device_node_marks_unhealthy_at_once_not_at_the_next_recheck(start_monitor, board: Path) -> None:
    _, reports = start_monitor(recheck_interval_s=30.0)  # only inotify can be this quick
    (board / "dev/nvmap").unlink()
    wait_for(lambda: reports.calls, what="the Unhealthy report")
    ((gpu_id, health),) = reports.calls
    assert (gpu_id, health.healthy) == ("tegra-gm20b-0", False)
    assert "/dev/nvmap is missing" in health.reason


def test_recreated_node_recovers_after_the_quiet_period(start_monitor, board: Path) -> None:
    _, reports = start_monitor(recheck_interval_s=0.05)
    (board / "dev/nvgpu/igpu0/ctrl").unlink()
    wait_for(lambda: reports.calls, what="the Unhealthy report")
    (board / "dev/nvgpu/igpu0/ctrl").write_text("")
    recreated = time.monotonic()
    wait_for(lambda: len(reports.calls) == 2, what="the Healthy report")
    assert reports.healthy_flags() == [False, True]
    assert time.monotonic() - recreated >= 0.25, "recovered before the quiet period"


def test_node_that_stays_missing_never_recovers(start_monitor, board: Path) -> None:
    _, reports = start_monitor(recheck_interval_s=0.05, recovery_quiet_period_s=0.1)
    (board / "dev/nvhost-gpu").unlink()
    wait_for(lambda: reports.calls, what="the Unhealthy report")
    time.sleep(0.4)  # several rechecks and quiet periods
    assert reports.healthy_flags() == [False]


def test_removed_gpu_directory_marks_unhealthy_and_recovers_once_it_is_back(
    start_monitor, board: Path
) -> None:
    _, reports = start_monitor(recheck_interval_s=0.05)
    shutil.rmtree(board / "dev/nvgpu")
    wait_for(lambda: reports.calls, what="the Unhealthy report")
    (board / "dev/nvgpu/igpu0").mkdir(parents=True)
    (board / "dev/nvgpu/igpu0/ctrl").write_text("")
    wait_for(lambda: len(reports.calls) == 2, what="the Healthy report")
    assert reports.healthy_flags() == [False, True]


def test_without_inotify_the_periodic_recheck_still_finds_a_missing_node(
    start_monitor, board: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_inotify() -> None:
        raise OSError(errno.ENOSYS, "inotify is not available here")

    monkeypatch.setattr(tegra.inotify, "Inotify", no_inotify)
    _, reports = start_monitor(recheck_interval_s=0.1)
    (board / "dev/nvmap").unlink()
    wait_for(lambda: reports.calls, what="the periodic recheck to notice")
    assert "/dev/nvmap is missing" in reports.calls[0][1].reason


def test_kmsg_error_line_marks_unhealthy_and_the_gpu_recovers(start_monitor, board: Path) -> None:
    kmsg = board.parent / "kmsg"
    _, reports = start_monitor(recheck_interval_s=0.05)
    _append(kmsg, nvgpu("gk20a_channel_timeout_handler", "Job on channel 507 timed out"))
    wait_for(lambda: reports.calls, what="the Unhealthy report")
    assert "channel watchdog timeout" in reports.calls[0][1].reason
    wait_for(lambda: len(reports.calls) == 2, what="the Healthy report after the quiet period")


def test_kmsg_noise_lines_change_nothing(start_monitor, board: Path) -> None:
    kmsg = board.parent / "kmsg"
    _, reports = start_monitor()
    _append(kmsg,
            "6,1,2,-;usb 1-2: new high-speed USB device number 3 using tegra-xusb",
            nvgpu("nvgpu_set_err_notifier_locked", "error notifier set to 13 for ch 3"),  # application error
            nvgpu("gk20a_fifo_handle_sched_error", "fifo is waiting for ctx switch", tag="WRN", prio=4))
    # A later error line proves the noise lines above were read and judged before it.
    _append(kmsg, nvgpu("gk20a_pmu_isr", "pmu halt intr not implemented"))
    wait_for(lambda: reports.calls, what="the report for the PMU halt")
    assert len(reports.calls) == 1 and "PMU" in reports.calls[0][1].reason


def test_kmsg_backlog_from_before_start_is_skipped(start_monitor, board: Path) -> None:
    kmsg = board.parent / "kmsg"
    _append(kmsg, nvgpu("gk20a_pmu_isr", "pmu halt intr not implemented"))  # an old boot message
    _, reports = start_monitor()
    _append(kmsg, nvgpu("gk20a_channel_timeout_handler", "Job on channel 9 timed out"))
    wait_for(lambda: reports.calls, what="the report for the new line")
    assert len(reports.calls) == 1 and "channel watchdog" in reports.calls[0][1].reason


def test_line_written_in_two_pieces_is_judged_once_complete(start_monitor, board: Path) -> None:
    kmsg = board.parent / "kmsg"
    _, reports = start_monitor()
    line = nvgpu("gk20a_pmu_isr", "pmu halt intr not implemented")
    with open(kmsg, "a") as f:
        f.write(line[:30])
    time.sleep(0.1)
    assert reports.calls == []
    with open(kmsg, "a") as f:
        f.write(line[30:] + "\n")
    wait_for(lambda: reports.calls, what="the report once the line is complete")


def test_kmsg_from_a_fifo_skips_what_was_queued_and_reads_new_lines(start_monitor, board: Path) -> None:
    fifo = board.parent / "kmsg.fifo"
    os.mkfifo(fifo)
    reader_guard = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer open before the monitor
    writer = os.open(fifo, os.O_WRONLY)
    try:
        os.write(writer, (nvgpu("gk20a_pmu_isr", "pmu halt intr not implemented") + "\n").encode())
        os.close(reader_guard)  # the monitor's reader takes over the queued line: its backlog
        _, reports = start_monitor(kmsg=fifo)
        time.sleep(0.1)
        assert reports.calls == [], "the queued line counted as news"
        line = nvgpu("gk20a_channel_timeout_handler", "Job on channel 7 timed out")
        os.write(writer, (line + "\n").encode())
        wait_for(lambda: reports.calls, what="the report for the FIFO line")
        assert "channel watchdog" in reports.calls[0][1].reason
    finally:
        os.close(writer)


def _readable_kmsg() -> bool:
    try:
        return stat.S_ISCHR(os.stat("/dev/kmsg").st_mode) and os.access("/dev/kmsg", os.R_OK)
    except OSError:
        return False


@pytest.mark.skipif(not _readable_kmsg(), reason="needs a readable /dev/kmsg")
def test_real_dev_kmsg_is_read_without_marking_from_its_backlog(start_monitor) -> None:
    monitor, reports = start_monitor(kmsg=Path("/dev/kmsg"))
    time.sleep(0.2)
    assert monitor.alive()
    assert reports.calls == [], f"a fresh GPU was marked from the kernel's backlog: {reports.calls}"


def test_unreadable_kmsg_leaves_node_checks_running(start_monitor, board: Path) -> None:
    monitor, reports = start_monitor(kmsg=board.parent / "no-such-kmsg")
    assert monitor.alive()
    (board / "dev/nvmap").unlink()
    wait_for(lambda: reports.calls, what="the node check")


def test_health_checks_disabled_by_env_report_nothing(start_monitor, board: Path) -> None:
    monitor, reports = start_monitor(env={"DP_DISABLE_HEALTHCHECKS": "all"}, recheck_interval_s=0.02)
    (board / "dev/nvmap").unlink()
    _append(board.parent / "kmsg", nvgpu("gk20a_pmu_isr", "pmu halt intr not implemented"))
    time.sleep(0.2)
    assert reports.calls == []
    assert monitor.alive()


def test_stop_ends_the_thread_promptly_and_alive_turns_false(start_monitor) -> None:
    monitor, _ = start_monitor()
    assert monitor.alive()
    started = time.monotonic()
    monitor.stop()
    monitor.stop()  # idempotent
    assert time.monotonic() - started < 2.0, "stop waited for the 30 s recheck"
    assert not monitor.alive()
    assert not any(t.name == "tegra-health" and t.is_alive() for t in threading.enumerate())


def test_alive_is_false_when_the_thread_died(board: Path) -> None:
    def exploding_report(gpu_id: str, health: Health) -> None:
        raise RuntimeError("report failed")

    monitor = TegraHealthMonitor(str(board), str(board.parent / "kmsg"), 0.3, env={})
    monitor.start([_gpu()], exploding_report)
    try:
        assert monitor.alive()
        (board / "dev/nvmap").unlink()
        wait_for(lambda: not monitor.alive(), what="the thread to die")
    finally:
        monitor.stop()


def _char_node(root: Path, shown_as: str, registered: bool) -> str:
    """`shown_as` under `root` as a real character device (/dev/null's, major 1), with a
    /proc/devices that has (or lacks) major 1 among the drivers' character majors."""
    host = root / shown_as.lstrip("/")
    host.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("/dev/null", host)
    (root / "proc").mkdir(parents=True, exist_ok=True)
    majors = "  1 mem\n" if registered else ""
    (root / "proc/devices").write_text(f"Character devices:\n{majors}  4 tty\n\nBlock devices:\n  1 ramdisk\n")
    return str(host)


def test_session_node_is_checked_against_the_registered_devices_not_os_access(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def access_says_nothing_for_root(path: str, mode: int) -> bool:
        raise AssertionError("os.access always passes for root: it must not decide")

    monkeypatch.setattr(tegra.os, "geteuid", lambda: 0)
    monkeypatch.setattr(tegra.os, "access", access_says_nothing_for_root)
    assert check_device_node(_char_node(tmp_path / "ok", "/dev/nvhost-gpu", True), "/dev/nvhost-gpu") is None
    problem = check_device_node(_char_node(tmp_path / "gone", "/dev/nvhost-gpu", False), "/dev/nvhost-gpu")
    assert problem is not None and "no device behind it" in problem and "major 1" in problem


def test_a_file_where_a_session_node_should_be_is_a_problem_when_proc_is_visible(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvhost-gpu").write_text("")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text("Character devices:\n  1 mem\n")
    problem = check_device_node(str(tmp_path / "dev/nvhost-gpu"), "/dev/nvhost-gpu")
    assert problem is not None and "not a character device" in problem


def test_permissions_are_checked_when_the_plugin_is_not_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nvhost-gpu").write_text("")
    monkeypatch.setattr(tegra.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(tegra.os, "access", lambda path, mode: False)
    problem = check_device_node(str(tmp_path / "nvhost-gpu"), "/dev/nvhost-gpu")
    assert problem is not None and "permission denied" in problem
