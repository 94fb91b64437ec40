"""The plugin's memory under clients that do not play along, beside the kubelet's own stream.

Run (after bench/go/build.sh):
    .venvs/plugin-oldest/bin/python bench/abuse_bench.py [--flips 10000] [--gpus 64 --replicas 4]

The plugin runs as a process (simulated GPUs, health flipped through its health files) with
bench/go's kubelet-client (the kubelet's own device manager) as the kubelet: registered, its
ListAndWatch stream open. Then, one after the other, each with a fresh raw HTTP/2 connection (tests/plugin/h2_peer.py):

- zero window: ListAndWatch with SETTINGS_INITIAL_WINDOW_SIZE 0 and never a WINDOW_UPDATE,
  while health flips `--flips` times;
- wedged reader: ListAndWatch with the largest windows, never reading the socket, same flips;
- PING flood and SETTINGS flood: sent until the plugin stops reading, never reading answers.

After each: the plugin's RSS and its peak (VmHWM), and whether the kubelet's stream then
got the newest device list. Nothing is asserted: tests/plugin/test_h2_bounds.py does that.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugin" / "src"), str(ROOT / "tests" / "plugin")]

from h2_peer import (  # noqa: E402
    DATA,
    END_STREAM,
    INITIAL_WINDOW_SIZE,
    LIST_AND_WATCH,
    Peer,
    frame,
    grpc_message,
    ping,
    request_fields,
    settings,
    window_update,
)


def load_kubelet_bench():
    spec = importlib.util.spec_from_file_location("kubelet_bench_abuse", ROOT / "bench" / "kubelet_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def memory(pid: int) -> tuple[float, float]:
    """(RSS, peak RSS) in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def open_watch(peer: Peer) -> None:
    peer.send(peer.headers(1, request_fields(LIST_AND_WATCH)), frame(DATA, END_STREAM, 1, grpc_message(b"")))


def flood(peer: Peer, one: bytes, seconds: float = 3.0, most: int = 200_000) -> int:
    """Send `one` frame after another until the plugin stops taking them (or `most` went out)."""
    peer.sock.setblocking(False)
    batch, sent, stalled_since = one * 512, 0, None
    pending = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sent < most * len(one):
        chunk = pending or batch
        try:
            n = peer.sock.send(chunk)
        except BlockingIOError:
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > seconds:
                break
            time.sleep(0.01)
            continue
        stalled_since = None
        sent += n
        pending = chunk[n:]
    return sent // len(one)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.kb = load_kubelet_bench()
        self.work = tempfile.mkdtemp(prefix="gdp-abuse-", dir="/tmp")
        self.socket_dir = os.path.join(self.work, "sock")
        self.health = Path(self.work, "health")
        os.makedirs(self.socket_dir)
        self.health.mkdir()
        config = Path(self.work, "config.yaml")
        config.write_text(f"version: v1\nflags:\n  deviceDiscoveryStrategy: simulated\n  plugin:\n"
                          f"    simulatedGpus: {args.gpus}\nsharing:\n  timeSlicing:\n    resources:\n"
                          f"    - name: nvidia.com/gpu\n      replicas: {args.replicas}\n")
        self.devices = args.gpus * args.replicas
        self.client = self.kb.GoClient(self.kb.GO_BIN / "kubelet-client", self.socket_dir)
        self.plugin = subprocess.Popen(
            [args.python, "-m", "gpu_device_plugin", "--kubelet-socket", f"{self.socket_dir}/kubelet.sock",
             "--config-file", str(config), "--simulated-health-dir", str(self.health),
             "--health-recovery-period", "0", "--log-level", "info"],
            env={**os.environ, "PYTHONPATH": str(ROOT / "plugin" / "src"), "JOURNAL_STREAM": ""},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client.wait("registered", 30)
        self.client.wait("devices", 30)
        self.path = os.path.join(self.socket_dir, "gpu-device-plugin.sock")
        for name in os.listdir(self.socket_dir):
            if name != "kubelet.sock":
                self.path = os.path.join(self.socket_dir, name)
        self.marker = 0
        self.lists = 0  # device lists the kubelet's stream received

    def flip(self, times: int) -> None:
        """`times` health changes of one GPU, each seen by the kubelet's stream before the next (the
        health files' inotify events would otherwise merge: many writes, few changes)."""
        flag = self.health / "sim-gpu-0"
        healthy = self.devices - self.marker * self.args.replicas
        for i in range(times):
            sick = i % 2 == 0
            flag.write_text("Unhealthy" if sick else "Healthy")
            self.wait_healthy(healthy - self.args.replicas if sick else healthy)
        if times % 2:
            flag.write_text("Healthy")
            self.wait_healthy(healthy)

    def wait_healthy(self, wanted: int, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = self.client.wait("devices", max(0.1, deadline - time.monotonic()))
            except self.kb.BenchError:
                return False
            self.lists += 1
            if event["healthy"] == wanted:
                return True
        return False

    def newest_reaches_the_kubelet(self) -> bool:
        """Mark one more GPU unhealthy, then wait for the kubelet's stream to show exactly that."""
        self.marker += 1
        Path(self.health, f"sim-gpu-{self.marker}").write_text("Unhealthy")
        return self.wait_healthy(self.devices - self.marker * self.args.replicas)

    def report(self, phase: str, detail: str) -> None:
        newest = self.newest_reaches_the_kubelet()
        rss, peak = memory(self.plugin.pid)
        print(f"{phase:<28} RSS {rss:5.1f} MiB, peak {peak:5.1f} MiB; the kubelet's stream: {self.lists} lists, "
              f"the newest {'yes' if newest else 'NO'} ({detail}; load {os.getloadavg()[0]:.2f})", flush=True)
        self.lists = 0

    def run(self) -> None:
        flips = self.args.flips
        self.report("registered, idle", f"{self.devices} devices")
        stalled = Peer(self.path, {INITIAL_WINDOW_SIZE: 0})
        open_watch(stalled)
        self.flip(flips)
        self.report("zero-window ListAndWatch", f"{flips} health changes")
        stalled.close()
        wedged = Peer(self.path, {INITIAL_WINDOW_SIZE: 0x7FFFFFFF})
        wedged.send(window_update(0, 0x7FFFFFFF - 65535))
        open_watch(wedged)
        self.flip(flips)
        self.report("huge window, never reads", f"{flips} health changes")
        wedged.close()
        for name, one in (("PING", ping(b"flooding")), ("SETTINGS", settings({INITIAL_WINDOW_SIZE: 65535}))):
            flooder = Peer(self.path)
            sent = flood(flooder, one)
            self.report(f"{name} flood, never reads", f"{sent} frames sent before the plugin stopped reading")
            flooder.close()

    def close(self) -> None:
        self.plugin.terminate()
        self.plugin.wait(10)
        self.client.close()
        sys.modules.pop("kubelet_bench_abuse", None)
        shutil.rmtree(self.work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flips", type=int, default=10_000, help="health changes per stalled-reader phase")
    parser.add_argument("--gpus", type=int, default=64, help="simulated GPUs (1..64)")
    parser.add_argument("--replicas", type=int, default=4, help="time-slicing replicas per GPU")
    parser.add_argument("--python", default=sys.executable, help="interpreter the plugin runs on")
    args = parser.parse_args(argv)
    bench = Bench(args)
    try:
        stack = load_kubelet_bench().python_stack(args.python)
        print(f"plugin: {stack}; kubelet: the device manager in bench/go kubelet-client; {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.2f}")
        bench.run()
    finally:
        bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
