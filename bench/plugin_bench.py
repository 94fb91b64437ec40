"""Measure the plugin's figures against the kubelet double, over real Unix sockets.

Run: <venv>/bin/python bench/plugin_bench.py [--idle-seconds 60] [--allocations 2000]
Prints one line per figure with the design's target beside it. Nothing is asserted:
this is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugin" / "src"), str(ROOT / "tests" / "plugin")]

from kubelet_double import KubeletDouble  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def start_plugin(socket_dir: str, health_dir: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugin" / "src")}
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_device_plugin", "--device-discovery-strategy", "simulated",
         "--simulated-gpus", "2", "--simulated-health-dir", health_dir,
         "--kubelet-socket", f"{socket_dir}/kubelet.sock", "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def private_mib(pid: int) -> float:
    """Memory only this process holds (RSS minus pages shared with others, e.g. grpcio's library)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    return sum(int(fields[k].split()[0]) for k in ("Private_Clean", "Private_Dirty")) / 1024


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle CPU window in seconds")
    parser.add_argument("--allocations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="repeats for start/restart/health figures")
    args = parser.parse_args()
    import google.protobuf
    import grpc

    print(f"python {sys.version.split()[0]}, grpcio {grpc.__version__}, protobuf {google.protobuf.__version__}")
    socket_dir = tempfile.mkdtemp(prefix="gdp-bench-", dir="/tmp")
    health_dir = os.path.join(socket_dir, "health")
    os.makedirs(health_dir)
    kubelet = KubeletDouble(socket_dir)
    kubelet.start()
    starts, restarts, health = [], [], []
    proc: subprocess.Popen | None = None
    try:
        for _ in range(args.rounds):  # start to registered, fresh process each time
            count = len(kubelet.registrations)
            t0 = time.monotonic()
            proc = start_plugin(socket_dir, health_dir)
            kubelet.wait_registered(count=count + 1, timeout=30)
            starts.append(kubelet.registrations[-1][2] - t0)
            proc.terminate()
            proc.wait(10)
        proc = start_plugin(socket_dir, health_dir)
        endpoint = kubelet.wait_registered(count=len(kubelet.registrations) + 1, timeout=30)
        endpoint.wait_for(lambda d: len(d) == 2)
        latencies = []
        for i in range(args.allocations):
            t = time.perf_counter()
            endpoint.allocate([f"sim-gpu-{i % 2}"])
            latencies.append((time.perf_counter() - t) * 1000)
        for i in range(args.rounds * 2):  # health change to ListAndWatch
            state = "Unhealthy" if i % 2 == 0 else "Healthy"
            t0 = time.monotonic()
            Path(health_dir, "sim-gpu-1").write_text(state)
            endpoint.wait_for(lambda d, s=state: d.get("sim-gpu-1") == s, timeout=5)
            health.append(endpoint.update_times[-1] - t0)
        time.sleep(2)
        rss, private = rss_mib(proc.pid), private_mib(proc.pid)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(args.idle_seconds)
        idle_cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0) * 100
        for _ in range(args.rounds):  # kubelet restart to registered again
            count = len(kubelet.registrations)
            t0 = time.monotonic()
            kubelet.restart()
            kubelet.wait_registered(count=count + 1, timeout=10)
            restarts.append(kubelet.registrations[-1][2] - t0)
            time.sleep(0.2)
        proc.terminate()
        proc.wait(10)
    finally:
        if proc is not None and proc.poll() is None:  # a failed measurement leaves no plugin behind
            proc.kill()
            proc.wait(5)
        kubelet.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
    ms = 1000
    print(f"allocate round trip p50 {percentile(latencies, 0.5):.3f} ms, p99 {percentile(latencies, 0.99):.3f} ms "
          f"over {len(latencies)} calls (target <= 0.4 / <= 1 ms)")
    print(f"idle RSS after registration {rss:.1f} MiB, private {private:.1f} MiB (target <= 30 MiB)")
    print(f"idle CPU {idle_cpu:.3f} % of a core over {args.idle_seconds:.0f} s (target < 0.1 %)")
    print(f"start to registered median {statistics.median(starts) * ms:.0f} ms, max {max(starts) * ms:.0f} ms "
          f"(target <= 500 ms)")
    print(f"kubelet restart to registered median {statistics.median(restarts) * ms:.1f} ms, "
          f"max {max(restarts) * ms:.1f} ms (target <= 300 ms)")
    print(f"health change to ListAndWatch median {statistics.median(health) * ms:.1f} ms, "
          f"max {max(health) * ms:.1f} ms (target <= 1000 ms)")


if __name__ == "__main__":
    main()
