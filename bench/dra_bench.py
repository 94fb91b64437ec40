#!/usr/bin/env python3
"""The DRA driver beside a Go DRA driver on Kubernetes' own kubelet-plugin helper, in the same run.

Both run as processes against one API server (tests/plugin/fake_apiserver.py: in memory, on
loopback, the calls both make), each with two simulated GPUs, and each does per claim what a real
driver does: read the claim from the API server, write its CDI spec and its checkpoint atomically.
The Go side (bench/dra/: `reference-driver` on k8s.io/dynamic-resource-allocation/kubeletplugin
v0.36.3, dra-example-driver not being served by the Go module proxy; `kubelet-client` with
k8s.io/kubelet's generated v1 client, as the kubelet's DRA manager calls) is built from the
module proxy into build/bench-dra/ when missing.

Per round and target: start -> its ResourceSlice holds both GPUs on the API server; then
NodePrepareResources and NodeUnprepareResources for each claim, one claim per call, timed by the
Go client; targets take turns in each round. Printed: per round, and medians over rounds.

    .venvs/plugin-kirkstone/bin/python bench/dra_bench.py --rounds 5 --claims 500
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GO_SRC = REPO / "bench" / "dra"
GO_BIN = Path(os.environ.get("BENCH_DRA_OUT", REPO / "build" / "bench-dra"))
sys.path.insert(0, str(REPO / "tests" / "plugin"))

from fake_apiserver import FakeApiServer  # noqa: E402  (test code: the API server both drivers talk to)

NODE = "node-a"
OURS = "gpu.meta-gpu-k8s.io"
GO = "gpu.bench.example.com"


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def build_go() -> None:
    if (GO_BIN / "reference-driver").exists() and (GO_BIN / "kubelet-client").exists():
        return
    if shutil.which("go") is None:
        raise SystemExit("error: no Go toolchain. fix: install Go >= 1.26 (the Go side is built from the module proxy)")
    print(f"building the Go driver and client into {GO_BIN} (module proxy; minutes the first time)", flush=True)
    GO_BIN.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "build", "-o", str(GO_BIN) + "/", "./reference-driver", "./kubelet-client"],
                   cwd=GO_SRC, check=True)


def claim(driver: str, index: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c{index}", "namespace": driver.split(".")[1], "uid": f"{driver}-uid-{index}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": driver, "pool": NODE, "device": f"gpu-{index % 2}"}]}}}}


class Target:
    def __init__(self, name: str, driver: str, python: str) -> None:
        self.name = name
        self.driver = driver
        self.python = python

    def command(self, dirs: dict[str, str]) -> list[str]:
        common = ["--kubeconfig", dirs["kubeconfig"], "--node-name", NODE, "--driver-name", self.driver,
                  "--plugins-registry-dir", dirs["registry"], "--plugin-dir", dirs["plugin"],
                  "--cdi-dir", dirs["cdi"], "--state-dir", dirs["state"]]
        if self.name == "go-reference":
            return [str(GO_BIN / "reference-driver"), *common, "--gpus", "2"]
        return [self.python, "-m", "gpu_device_plugin", "dra", *common, "--device-discovery-strategy", "simulated",
                "--simulated-gpus", "2", "--allocation-api", "dra", "--log-level", "warning"]


def run_target(target: Target, api: FakeApiServer, claims: list[dict], warmup: int, base: str) -> dict:
    root = tempfile.mkdtemp(prefix="gdra-b-", dir=base)
    dirs = {name: os.path.join(root, name) for name in ("registry", "plugin", "cdi", "state")}
    dirs["kubeconfig"] = api.kubeconfig(os.path.join(root, "kubeconfig"))
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugin" / "src")}
    for key in ("KUBECONFIG", "NODE_NAME", "ALLOCATION_API"):
        env.pop(key, None)
    started = time.monotonic()
    process = subprocess.Popen(target.command(dirs), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        api.wait_for(lambda a: sum(len(s["spec"]["devices"]) for s in a.slice_list()
                                   if s["spec"]["driver"] == target.driver) == 2, timeout=60)
        published_ms = (time.monotonic() - started) * 1000
        socket = os.path.join(dirs["plugin"], "dra.sock")
        lines = "".join(f"{c['metadata']['namespace']} {c['metadata']['name']} {c['metadata']['uid']}\n"
                        for c in claims)
        done = subprocess.run([str(GO_BIN / "kubelet-client"), "--socket", socket], input=lines, text=True,
                              capture_output=True, timeout=600, check=True)
        results = [json.loads(line) for line in done.stdout.splitlines()]
        errors = [r["error"] for r in results if r["error"]]
        if errors:
            raise SystemExit(f"{target.name}: {len(errors)} calls failed, first: {errors[0]}")
        timed = results[warmup:]
        return {"published_ms": published_ms,
                "prepare_p50": percentile([r["prepare_us"] for r in timed], 50),
                "prepare_p99": percentile([r["prepare_us"] for r in timed], 99),
                "unprepare_p50": percentile([r["unprepare_us"] for r in timed], 50),
                "unprepare_p99": percentile([r["unprepare_us"] for r in timed], 99)}
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        with api._cond:  # the next round starts from an empty API server, as a new node would
            for name in [n for n, s in api.slices.items() if s["spec"]["driver"] == target.driver]:
                del api.slices[name]
        shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="fresh starts of every target (medians over them)")
    parser.add_argument("--claims", type=int, default=500, help="timed prepare/unprepare pairs per target and round")
    parser.add_argument("--warmup", type=int, default=50, help="untimed pairs first")
    parser.add_argument("--python", default=sys.executable, help="interpreter our driver runs on")
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp",
                        help="where both keep sockets, CDI specs and checkpoints (default a tmpfs, as /var/run/cdi is: "
                        "the disk's fsync time would be the figure, not the drivers')")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.claims < 1 or args.warmup < 0:
        parser.error("--rounds and --claims take 1 or more, --warmup 0 or more")
    build_go()
    targets = [Target("go-reference", GO, args.python), Target("python", OURS, args.python)]
    version = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    print(f"our driver on Python {version}; Go: kubeletplugin v0.36.3, grpc-go v1.79.3, "
          f"{subprocess.run(['go', 'version'], capture_output=True, text=True).stdout.strip()}")
    rounds: dict[str, list[dict]] = {t.name: [] for t in targets}
    with FakeApiServer(token="") as api:  # client-go sends no bearer token over plain HTTP: no auth here
        api.add_node(NODE)
        claims = {t.name: [claim(t.driver, i) for i in range(args.warmup + args.claims)] for t in targets}
        for t in targets:
            for c in claims[t.name]:
                api.put_claim(c)
        for number in range(1, args.rounds + 1):
            order = targets if number % 2 else list(reversed(targets))
            for target in order:
                figures = run_target(target, api, claims[target.name], args.warmup, args.dir)
                rounds[target.name].append(figures)
                print(f"round {number} {target.name}: start->published {figures['published_ms']:.0f} ms, "
                      f"prepare p50 {figures['prepare_p50']} us p99 {figures['prepare_p99']} us, "
                      f"unprepare p50 {figures['unprepare_p50']} us p99 {figures['unprepare_p99']} us", flush=True)
    print(f"\nmedians over {args.rounds} round(s), {args.claims} timed claims each:")
    print("| target | prepare p50 us | prepare p99 us | unprepare p50 us | unprepare p99 us | start->published ms |")
    print("|---|---|---|---|---|---|")
    go_p50 = statistics.median(r["prepare_p50"] for r in rounds["go-reference"])
    for name, figures in rounds.items():
        def med(key: str, figures: list[dict] = figures) -> float:
            return statistics.median(r[key] for r in figures)
        ratio = "" if name == "go-reference" else f" ({med('prepare_p50') / go_p50:.2f}x Go)"
        print(f"| {name} | {med('prepare_p50'):.0f}{ratio} | {med('prepare_p99'):.0f} | {med('unprepare_p50'):.0f} | "
              f"{med('unprepare_p99'):.0f} | {med('published_ms'):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
