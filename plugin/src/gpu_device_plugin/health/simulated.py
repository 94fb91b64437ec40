"""Health of simulated GPUs, flipped from outside through files in a directory.

A file named after a device ID (e.g. `sim-gpu-1`) whose content starts with "Unhealthy"
marks that GPU unhealthy; removing the file (or writing "Healthy") makes it healthy again.
Tests and smoke checks use this to prove health reaches the kubelet.
"""

from __future__ import annotations

import os
import selectors
import threading
from collections.abc import Sequence

from ..host import inotify
from ..model import HEALTHY, Gpu, Health
from .base import Report

_EVENTS = inotify.IN_CLOSE_WRITE | inotify.IN_CREATE | inotify.IN_DELETE | inotify.IN_MOVED_TO | inotify.IN_MOVED_FROM


class SimulatedHealthMonitor:
    def __init__(self, health_dir: str) -> None:
        self.health_dir = health_dir
        self._thread: threading.Thread | None = None
        self._stop_r, self._stop_w = -1, -1  # made by start, closed by stop: nothing outlives the monitor
        self._failed = False

    def read_health(self, gpus: Sequence[Gpu]) -> dict[str, Health]:
        out = {}
        for gpu in gpus:
            try:
                with open(os.path.join(self.health_dir, gpu.id)) as f:
                    text = f.read(256).strip()
            except OSError:
                text = ""
            out[gpu.id] = Health(False, f"marked unhealthy in {self.health_dir}") if text.lower().startswith(
                "unhealthy") else HEALTHY
        return out

    def start(self, gpus: Sequence[Gpu], report: Report) -> None:
        os.makedirs(self.health_dir, exist_ok=True)
        watcher = inotify.Inotify()
        try:
            watcher.add_watch(self.health_dir, _EVENTS)
        except OSError:
            watcher.close()
            raise
        for gpu_id, health in self.read_health(gpus).items():
            if not health.healthy:
                report(gpu_id, health)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._loop, args=(watcher, list(gpus), report),
                                        name="simulated-health", daemon=True)
        self._thread.start()

    def _loop(self, watcher: inotify.Inotify, gpus: list[Gpu], report: Report) -> None:
        selector = selectors.DefaultSelector()
        try:
            selector.register(watcher.fileno(), selectors.EVENT_READ, "inotify")
            selector.register(self._stop_r, selectors.EVENT_READ, "stop")
            while True:
                keys = [key.data for key, _ in selector.select()]
                if "stop" in keys:
                    return
                watcher.read_events()
                for gpu_id, health in self.read_health(gpus).items():
                    report(gpu_id, health)
        except Exception:
            self._failed = True
            raise
        finally:
            selector.close()
            watcher.close()

    def stop(self) -> None:
        if self._thread is None:
            return
        os.write(self._stop_w, b"x")
        self._thread.join(2)
        if not self._thread.is_alive():  # a thread still selecting on the pipe keeps it
            os.close(self._stop_r)
            os.close(self._stop_w)
            self._stop_r, self._stop_w = -1, -1
        self._thread = None

    def alive(self) -> bool:
        return not self._failed and (self._thread is None or self._thread.is_alive())
