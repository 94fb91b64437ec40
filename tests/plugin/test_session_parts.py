"""The daemon's parts on their own: inotify meanings, back-off, reload plan and reload, the
watchdog's pings, signals, counters."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time

import pytest
from gpu_device_plugin.config import reload_policy
from gpu_device_plugin.config.settings import ConfigError, Settings
from gpu_device_plugin.core.state import DeviceState
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.host import inotify
from gpu_device_plugin.host.inotify import Event
from gpu_device_plugin.observability.readiness import Readiness
from gpu_device_plugin.observability.stats import Stats
from gpu_device_plugin.session.backoff import Backoff
from gpu_device_plugin.session.dir_events import FILE_EVENTS, Seen, Watches, classify
from gpu_device_plugin.session.kubelet import KubeletSession
from gpu_device_plugin.session.reload import ConfigReload
from gpu_device_plugin.session.supervision import Supervision
from helpers import wait_until

WATCHES = Watches(socket_wd=1, config_wd=2, kubelet_name="kubelet.sock", endpoint_name="nvidia-gpu.sock",
                  config_name="config.yaml")


def test_a_queue_overflow_rechecks_the_sockets_and_the_config_file() -> None:
    assert classify([Event(-1, inotify.IN_Q_OVERFLOW, "")], WATCHES) == Seen(resync=True, reload=True)


@pytest.mark.parametrize(("event", "expected"), [
    (Event(1, inotify.IN_CREATE, "kubelet.sock"), Seen(kubelet_started=True)),
    (Event(1, inotify.IN_MOVED_TO, "kubelet.sock"), Seen(kubelet_started=True)),
    (Event(1, inotify.IN_DELETE, "nvidia-gpu.sock"), Seen(endpoint_deleted=True)),
    (Event(1, inotify.IN_IGNORED, ""), Seen(resync=True)),
    (Event(1, inotify.IN_DELETE, "kubelet.sock"), Seen()),
    (Event(2, inotify.IN_CLOSE_WRITE, "config.yaml"), Seen(reload=True)),
    (Event(2, inotify.IN_MOVED_TO, "..data"), Seen(reload=True)),
    (Event(2, inotify.IN_CREATE, "config.yaml"), Seen()),  # still being written
    (Event(2, inotify.IN_CLOSE_WRITE, "other.yaml"), Seen()),
])
def test_what_each_event_means(event: Event, expected: Seen) -> None:
    assert classify([event], WATCHES) == expected


def test_a_config_file_in_the_socket_directory_is_seen_by_the_shared_watch() -> None:
    shared = WATCHES._replace(config_wd=1)
    assert classify([Event(1, FILE_EVENTS & inotify.IN_CLOSE_WRITE, "config.yaml")], shared) == Seen(reload=True)


def test_backoff_doubles_to_its_maximum_and_starts_over_after_success() -> None:
    now = [100.0]
    backoff = Backoff(0.05, 0.3, clock=lambda: now[0])
    assert [backoff.schedule() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    assert backoff.due_at == pytest.approx(100.3) and not backoff.due()
    now[0] = 100.3
    assert backoff.due()
    backoff.reset()
    backoff.cancel()
    assert not backoff.due() and backoff.schedule() == 0.05


def test_reload_plan_keeps_restart_only_fields_and_names_them() -> None:
    old = Settings(device_discovery_strategy="simulated", simulated_gpus=2)
    new = old._replace(simulated_gpus=5, metrics_address="127.0.0.1:1", device_id_strategy="index")
    decided = reload_policy.plan(old, new, "simulated")
    assert decided.kept == ("simulated_gpus", "metrics_address")
    assert decided.settings == old._replace(device_id_strategy="index")
    assert reload_policy.plan(old, old, "simulated") == reload_policy.ReloadPlan(None)


def test_reload_plan_rejects_what_the_running_gpus_cannot_serve() -> None:
    old = Settings()
    decided = reload_policy.plan(old, old._replace(device_list_strategy=("cdi-cri",), cdi_kind="nvidia.com/gpu"),
                                 "tegra")
    assert decided.settings is None and "the NVIDIA Container Toolkit's own kind" in decided.rejection
    assert reload_policy.plan(old, old._replace(device_list_strategy=("cdi-cri",)), "nvml").settings is not None


def test_a_reload_that_does_not_load_is_rejected_once_counted_and_not_applied(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> Settings:
        raise ConfigError("config file: flags.plugin.deviceIDStrategy must be one of uuid, index")

    stats, applied = Stats(), []
    reload = ConfigReload(broken, Settings, lambda new, kept: applied.append(new), "simulated", stats)
    reload.run_if_requested()
    assert stats.config_rejections == 0, "nothing was asked for"
    reload.request()
    reload.request()  # SIGHUP and a file event before the loop runs: one reload
    with caplog.at_level(logging.ERROR):
        reload.run_if_requested()
        reload.run_if_requested()
    assert stats.config_rejections == 1 and applied == []
    assert "keeping the last good one" in caplog.text and "deviceIDStrategy" in caplog.text


def test_a_reload_hands_on_the_plan_with_what_waits_for_a_restart() -> None:
    old = Settings(device_discovery_strategy="simulated", simulated_gpus=2)
    applied = []
    reload = ConfigReload(lambda: old._replace(simulated_gpus=4, device_id_strategy="index"), lambda: old,
                          lambda new, kept: applied.append((new, tuple(kept))), "simulated", Stats())
    reload.request()
    reload.run_if_requested()
    assert applied == [(old._replace(device_id_strategy="index"), ("simulated_gpus",))]


def test_the_watchdog_is_pinged_only_while_the_self_check_passes(socket_dir: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(f"{socket_dir}/notify")
    systemd.setblocking(False)
    environ = {"NOTIFY_SOCKET": f"{socket_dir}/notify", "WATCHDOG_USEC": "2"}  # a ping due every microsecond
    stats, state, readiness = Stats(), DeviceState(), Readiness(environ)
    settings = Settings(kubelet_socket=f"{socket_dir}/kubelet.sock", device_discovery_strategy="simulated")
    session = KubeletSession(settings, SimulatedBackend(1).discover(), state, stats, readiness)
    health_loop_runs = [True]
    supervision = Supervision(session, state, stats, readiness, "simulated", lambda: health_loop_runs[0], environ)
    try:
        assert supervision.ping_at is None, "no ping is due before the loop runs"
        supervision.start_watchdog()
        supervision.ping_if_due()
        assert systemd.recv(64) == b"WATCHDOG=1"
        health_loop_runs[0] = False
        assert wait_until(lambda: time.monotonic() >= (supervision.ping_at or 0.0))
        with caplog.at_level(logging.ERROR):
            supervision.ping_if_due()
        with pytest.raises(BlockingIOError):
            systemd.recv(64)
        assert "not pinging the systemd watchdog" in caplog.text
        assert not supervision.status().monitor_alive
    finally:
        supervision.close()
        systemd.close()


def test_without_a_systemd_watchdog_no_ping_is_ever_due() -> None:
    stats, state, readiness = Stats(), DeviceState(), Readiness({})
    session = KubeletSession(Settings(), [], state, stats, readiness)
    supervision = Supervision(session, state, stats, readiness, "none", lambda: True, {"WATCHDOG_USEC": "0"})
    supervision.start_watchdog()
    assert supervision.ping_at is None


def test_counters_bumped_from_many_threads_lose_nothing() -> None:
    stats = Stats()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: unlocked += loses updates here
    try:
        threads = [threading.Thread(target=lambda: [stats.add("allocations") for _ in range(5000)]) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert stats.allocations == 40000
    assert stats.snapshot().allocations == 40000


def test_the_daemon_gives_back_the_signal_handlers_it_found(socket_dir: str) -> None:
    from helpers import run_simulated

    runner = run_simulated(socket_dir)
    hups: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    signal.signal(signal.SIGHUP, lambda signum, frame: hups.append(signum))
    try:
        daemon = runner.daemon
        threading.Timer(0.3, daemon.stop).start()
        assert daemon.run() == 0  # in the main thread, as the CLI runs it: handlers installed
        assert signal.getsignal(signal.SIGTERM) == previous[signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) == previous[signal.SIGINT]
        os.kill(os.getpid(), signal.SIGHUP)  # the old handler wrote to the closed wake pipe: EBADF
        assert hups == [signal.SIGHUP]
        daemon.stop()  # a late stop from another thread must not touch the closed pipe either
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
