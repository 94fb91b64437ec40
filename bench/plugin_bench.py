"""Measure the plugin's figures against the kubelet double, over real Unix sockets.

Run: <venv>/bin/python bench/plugin_bench.py [--idle-seconds 60] [--admissions 2000] [--leg simulated]
     [--metrics [--scrape-interval 15]]
Prints one line per figure, each naming the discovery backend it comes from, with the
design's target beside it. Nothing is asserted: this is a measurement, not a test.
With --metrics the plugin serves /metrics and the idle window is scraped every
--scrape-interval seconds as Prometheus would (0: never), the tegra leg on the Nano
telemetry tree (tests/plugin/fixtures/telemetry/jetson-nano-r32) so the GPU collector reads
real files; RSS is given before the first scrape and after the window.

Legs (each a fresh plugin process, at the image's log level `info`):
- simulated: two simulated GPUs; health from the simulated health files.
- tegra: the Jetson Nano fixture tree (tests/plugin/fixtures/jetson-nano) through the real
  Tegra discovery and the real Tegra health monitor loop (device-node watches and rechecks,
  and the host's /dev/kmsg as its kernel log where it can be read).

An admission is what the kubelet's device manager does per container when the plugin offers
preferred allocation: GetPreferredAllocation, then Allocate, one after the other.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugin" / "src"), str(ROOT / "tests" / "plugin")]

from kubelet_double import KubeletDouble, PluginEndpoint  # noqa: E402

NANO_FIXTURE = ROOT / "tests" / "plugin" / "fixtures" / "jetson-nano"
NANO_TELEMETRY = ROOT / "tests" / "plugin" / "fixtures" / "telemetry" / "jetson-nano-r32"


@dataclass
class Leg:
    name: str  # the discovery backend the figures come from
    args: list[str]
    device_count: int
    make_unhealthy: Callable[[], None]
    make_healthy: Callable[[], None]
    device_id: str  # the device whose health the leg flips
    metrics_port: int = 0  # /metrics listens here when > 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def start_plugin(socket_dir: str, leg: Leg) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugin" / "src")}
    env.pop("JOURNAL_STREAM", None)
    metrics = ["--metrics-address", f"127.0.0.1:{leg.metrics_port}"] if leg.metrics_port else []
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_device_plugin", *leg.args, *metrics, "--kubelet-socket",
         f"{socket_dir}/kubelet.sock", "--log-level", "info", "--health-recovery-period", "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape_ms(port: int) -> float:
    t = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        response.read()
    return (time.perf_counter() - t) * 1000


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
    """CPU time of every thread so far: schedstat counts nanoseconds, /proc/PID/stat 10 ms ticks."""
    return sum(int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9


def simulated_leg(work: str) -> Leg:
    health_dir = os.path.join(work, "health")
    os.makedirs(health_dir)
    flag = Path(health_dir, "sim-gpu-1")
    return Leg("simulated", ["--device-discovery-strategy", "simulated", "--simulated-gpus", "2",
                             "--simulated-health-dir", health_dir], 2,
               lambda: flag.write_text("Unhealthy"), lambda: flag.write_text("Healthy"), "sim-gpu-1")


def tegra_leg(work: str, tree: Path = NANO_FIXTURE) -> Leg:
    root = os.path.join(work, "nano")
    shutil.copytree(tree, root, symlinks=True)
    try:  # a real kernel log makes the monitor's select() loop the one a Jetson runs
        with open("/dev/kmsg", "rb"):
            pass
        os.symlink("/dev/kmsg", os.path.join(root, "dev", "kmsg"))
    except OSError:
        pass
    node = Path(root, "dev", "nvhost-gpu")
    return Leg("tegra", ["--device-discovery-strategy", "tegra", "--host-root", root], 1,
               lambda: node.rename(node.with_suffix(".away")), lambda: node.with_suffix(".away").rename(node),
               "tegra-t210-igpu0")


def admit_once(endpoint: PluginEndpoint) -> float:
    """One kubelet admission of a 1-GPU container (GetPreferredAllocation + Allocate), then its release."""
    t = time.perf_counter()
    chosen, _ = endpoint.admit(1)
    elapsed = (time.perf_counter() - t) * 1000
    endpoint.release(chosen)
    return elapsed


def run_leg(leg: Leg, kubelet: KubeletDouble, socket_dir: str, args: argparse.Namespace) -> dict[str, object]:
    starts, restarts, health, latencies = [], [], [], []
    proc: subprocess.Popen | None = None
    try:
        for _ in range(args.rounds):  # start to registered, fresh process each time
            count = len(kubelet.registrations)
            t0 = time.monotonic()
            proc = start_plugin(socket_dir, leg)
            kubelet.wait_registered(count=count + 1, timeout=30)
            starts.append(kubelet.registrations[-1][2] - t0)
            proc.terminate()
            proc.wait(10)
        proc = start_plugin(socket_dir, leg)
        endpoint = kubelet.wait_registered(count=len(kubelet.registrations) + 1, timeout=30)
        endpoint.wait_for(lambda d: len(d) == leg.device_count and all(h == "Healthy" for h in d.values()))
        for _ in range(min(200, args.admissions)):  # warm-up: first calls pay for imports and channel setup
            admit_once(endpoint)
        # The kubelet is Go: keep this Python client's own garbage collection out of the figures.
        gc.collect()
        gc.disable()
        try:
            latencies = [admit_once(endpoint) for _ in range(args.admissions)]
        finally:
            gc.enable()
        for i in range(args.rounds * 2):  # health change to ListAndWatch
            unhealthy = i % 2 == 0
            want = "Unhealthy" if unhealthy else "Healthy"
            t0 = time.monotonic()
            (leg.make_unhealthy if unhealthy else leg.make_healthy)()
            endpoint.wait_for(lambda d, s=want: d.get(leg.device_id) == s, timeout=10)
            health.append(endpoint.update_times[-1] - t0)
        time.sleep(2)
        rss, private = rss_mib(proc.pid), private_mib(proc.pid)
        scrapes: list[float] = []
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        interval = args.scrape_interval if leg.metrics_port else 0
        while interval > 0 and time.monotonic() + interval <= t0 + args.idle_seconds:
            time.sleep(interval)
            scrapes.append(scrape_ms(leg.metrics_port))
        time.sleep(max(0.0, t0 + args.idle_seconds - time.monotonic()))
        idle_cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0) * 100
        rss_after, private_after = rss_mib(proc.pid), private_mib(proc.pid)
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
    return {"starts": starts, "restarts": restarts, "health": health, "latencies": latencies, "rss": rss,
            "private": private, "idle_cpu": idle_cpu, "scrapes": scrapes, "rss_after": rss_after,
            "private_after": private_after}


def preferred_allocation_ms() -> tuple[float, float]:
    """The policy core alone: 8 GPUs x 256 replicas, a 512-replica request (distributed, packed)."""
    from gpu_device_plugin.config.settings import Settings, TimeSlicing
    from gpu_device_plugin.core import policy
    from gpu_device_plugin.model import Gpu

    settings = Settings(time_slicing=TimeSlicing(replicas=256))
    gpus = [Gpu(id=f"GPU-{i}", index=i, name="bench", backend="nvml", numa_node=i // 4) for i in range(8)]
    devices = {d.id: d for d in policy.advertised_devices(gpus, settings)}
    out = []
    for name in ("distributed", "packed"):
        times = []
        for _ in range(20):
            t = time.perf_counter()
            policy.preferred_allocation(list(devices), [], 512, devices, name)
            times.append((time.perf_counter() - t) * 1000)
        out.append(statistics.median(times))
    return out[0], out[1]


def report(leg: str, r: dict[str, object], args: argparse.Namespace) -> None:
    ms = 1000
    lat, starts, restarts, health = r["latencies"], r["starts"], r["restarts"], r["health"]
    print(f"[{leg}] admission round trip (GetPreferredAllocation + Allocate) p50 {percentile(lat, 0.5):.3f} ms, "
          f"p99 {percentile(lat, 0.99):.3f} ms over {len(lat)} (target p50 <= 0.95, p99 <= 3 ms)")
    print(f"[{leg}] idle RSS after registration {r['rss']:.1f} MiB, private {r['private']:.1f} MiB "
          "(target <= 30 MiB)")
    scrapes = r["scrapes"]
    print(f"[{leg}] idle CPU {r['idle_cpu']:.4f} % of a core over {args.idle_seconds:.0f} s"
          + (f", scraped every {args.scrape_interval:g} s" if scrapes else "") + " (target < 0.1 %)")
    if args.metrics:
        print(f"[{leg}] /metrics: {len(scrapes)} scrapes, p50 {percentile(scrapes, 0.5) if scrapes else 0:.2f} ms; "
              f"RSS after the window {r['rss_after']:.1f} MiB, private {r['private_after']:.1f} MiB")
    print(f"[{leg}] start to registered median {statistics.median(starts) * ms:.0f} ms, "
          f"max {max(starts) * ms:.0f} ms (target <= 500 ms)")
    print(f"[{leg}] kubelet restart to registered median {statistics.median(restarts) * ms:.1f} ms, "
          f"max {max(restarts) * ms:.1f} ms (target <= 300 ms)")
    print(f"[{leg}] health change to ListAndWatch median {statistics.median(health) * ms:.1f} ms, "
          f"max {max(health) * ms:.1f} ms (target <= 1000 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle CPU window in seconds, per leg")
    parser.add_argument("--admissions", type=int, default=2000, help="kubelet admissions timed, per leg")
    parser.add_argument("--rounds", type=int, default=5, help="repeats for start/restart/health figures")
    parser.add_argument("--leg", choices=("simulated", "tegra"), action="append",
                        help="run only this leg (repeatable; default: both)")
    parser.add_argument("--metrics", action="store_true",
                        help="serve /metrics (GPU telemetry included) and scrape it in the idle window")
    parser.add_argument("--scrape-interval", type=float, default=15.0,
                        help="seconds between scrapes with --metrics (Prometheus' default 15; 0: never)")
    args = parser.parse_args()
    import google.protobuf
    import grpc

    print(f"python {sys.version.split()[0]}, grpcio {grpc.__version__}, protobuf {google.protobuf.__version__}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (p99 and start figures follow the load)")
    distributed, packed = preferred_allocation_ms()
    print(f"[policy] preferred allocation, 8 GPUs x 256 replicas, size 512: distributed {distributed:.2f} ms, "
          f"packed {packed:.2f} ms (target: milliseconds)")
    for name in args.leg or ("simulated", "tegra"):
        work = tempfile.mkdtemp(prefix="gdp-bench-", dir="/tmp")
        socket_dir = os.path.join(work, "sock")
        os.makedirs(socket_dir)
        kubelet = KubeletDouble(socket_dir)
        kubelet.start()
        try:
            if name == "simulated":
                leg = simulated_leg(work)
            else:
                leg = tegra_leg(work, NANO_TELEMETRY if args.metrics else NANO_FIXTURE)
            if args.metrics:
                leg.metrics_port = free_port()
            report(leg.name, run_leg(leg, kubelet, socket_dir, args), args)
            print(f"[{leg.name}] load average after the leg {os.getloadavg()[0]:.1f}")
        finally:
            kubelet.stop()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
