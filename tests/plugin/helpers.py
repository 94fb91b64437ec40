"""Shared pieces for tests that run the daemon for real on Unix sockets."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.health.base import HealthMonitor
from gpu_device_plugin.model import Health
from gpu_device_plugin.session.daemon import Daemon

# What every Allocate answer says of the NVIDIA Container Toolkit's feature devices by default (policy.feature_envs):
# "disabled" beats an image's own "enabled", which the toolkit honours for every GPU container.
FEATURES_OFF = {"NVIDIA_GDS": "disabled", "NVIDIA_MOFED": "disabled", "NVIDIA_GDRCOPY": "disabled",
                "NVIDIA_NVSWITCH": "disabled"}


def short_tempdir() -> str:
    # Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    return tempfile.mkdtemp(prefix="gdp-", dir="/tmp")


class RunningDaemon:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(daemon.run()), daemon=True)

    def __enter__(self) -> Daemon:
        self.thread.start()
        return self.daemon

    def __exit__(self, *exc: object) -> None:
        self.daemon.stop()
        self.thread.join(5)
        assert not self.thread.is_alive(), "daemon did not stop within 5 s"


def simulated_settings(socket_dir: str, gpus: int = 2, **overrides: object) -> Settings:
    base = Settings(kubelet_socket=os.path.join(socket_dir, "kubelet.sock"), device_discovery_strategy="simulated",
                    simulated_gpus=gpus)
    return base._replace(**overrides)  # type: ignore[arg-type]


def run_simulated(socket_dir: str, gpus: int = 2, monitor: HealthMonitor | None = None,
                  **overrides: object) -> RunningDaemon:
    settings = simulated_settings(socket_dir, gpus, **overrides)
    return RunningDaemon(Daemon(settings, SimulatedBackend(gpus).discover(), monitor, environ={}))


def cleanup(path: str) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Reports:
    """Thread-safe record of a monitor's report(gpu_id, health) calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[str, Health]] = []

    def __call__(self, gpu_id: str, health: Health) -> None:
        with self._lock:
            self.calls.append((gpu_id, health))

    def states(self) -> list[tuple[str, bool]]:
        with self._lock:
            return [(gpu_id, health.healthy) for gpu_id, health in self.calls]

    def healthy_flags(self) -> list[bool]:
        return [healthy for _, healthy in self.states()]


# Generous: a wait returns as soon as its condition holds, and a loaded CI host must not
# turn a slow thread into a failed test.
def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def remove_watched_tree(path: str) -> None:
    """`rm -rf` of a directory a running plugin serves a socket in, as a node reset does it: the plugin
    may put its socket back between rmtree's unlinks and its rmdir ("Directory not empty"); like rm -rf
    run again, this removes what came back until the directory itself is gone once."""
    for _ in range(50):
        try:
            shutil.rmtree(path)
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    raise AssertionError(f"{path} kept being refilled while it was removed")
