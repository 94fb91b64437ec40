"""The plugin against Kubernetes' own reference plugin, both called by the kubelet's own device manager.

Run (after bench/go/build.sh; bench/README.md has the figures and how to read them):
    .venvs/plugin-oldest/bin/python bench/kubelet_bench.py [--rounds 3] [--idle-seconds 60]

The client is bench/go's kubelet-client: the kubelet's device manager (k8s.io/kubernetes at the
version conformance/go.mod pins, our k3s's) serving kubelet.sock, with the kubelet's calls: it
takes the plugin's registration, keeps its ListAndWatch stream, and per admission runs the
manager's Allocate (the plugin's GetPreferredAllocation, then Allocate, then the manager's
checkpoint) and reads the container's run options. The reference is bench/go's stub-plugin:
Kubernetes' device plugin stub (the code of test/images/sample-device-plugin) answering as ours
does. Each round starts every target afresh with its own client (start -> its devices known to
the manager, first admission), then times their admissions in slices, the targets taking turns
(--slices), so that every target is measured over the same minutes of the machine, then reads
RSS/PSS and idle CPU. Medians over the rounds are printed with our/reference ratios, and with
the load average, the interpreter and library versions: the figures depend on all of them.
Our plugin runs on the interpreter running this script (or --python). Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
GO_BIN = Path(os.environ.get("BENCH_GO_OUT", ROOT / "build" / "bench-go")) / "bin"  # as bench/go/build.sh
NANO_FIXTURE = ROOT / "tests" / "plugin" / "fixtures" / "jetson-nano"
# The config file each image installs: the unit always starts the plugin with --config-file, so
# reading it (YAML) is part of every real start.
IMAGE_CONFIGS = ROOT / "meta-gpu-k8s" / "recipes-plugin" / "gpu-device-plugin" / "files"
REFERENCE = "go-reference"


class BenchError(Exception):
    pass


@dataclass
class Target:
    name: str  # "go-reference", "simulated", "tegra", or a --plugin / --variant name
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    setup: str = ""  # which leg's files prepare() makes: "simulated", "tegra" or none


@dataclass
class Sample:
    """One target's figures from one round."""

    target: str
    start_ms: float
    start_cpu_ms: float  # CPU the process used up to just after registering: what load cannot inflate
    first_us: float  # the first admission after registration (cold paths, first use of the connection)
    p50_us: float
    p99_us: float
    cpu_us: float  # the plugin's CPU per admission, every thread: what load cannot inflate
    rss_mib: float
    pss_mib: float
    idle_cpu_pct: float
    load: float
    libraries: str = ""  # notable native libraries mapped (grpcio, protobuf, PyYAML's C part)


# ------------------------------------------------------------------ figures (no processes)

def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: an observed value, never an interpolation."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


def parse_events(lines: Iterable[str]) -> list[dict]:
    """The client's JSON lines; anything else (a stray log line) is an error naming it."""
    events = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            raise BenchError(f"kubelet-client printed a line that is not JSON: {line[:120]!r}") from None
        if not isinstance(event, dict) or "event" not in event:
            raise BenchError(f"kubelet-client printed JSON without an event: {line[:120]!r}")
        events.append(event)
    return events


def admission_figures(event: dict) -> tuple[float, float]:
    """(p50, p99) in microseconds from an "admissions" event."""
    times = event.get("ns")
    if event.get("event") != "admissions" or not isinstance(times, list) or not times:
        raise BenchError(f"expected admission timings, got {str(event)[:120]}")
    micros = [t / 1000 for t in times]
    return percentile(micros, 0.5), percentile(micros, 0.99)


FIGURES = (  # attribute, heading, format; lower is better for all of them
    ("start_ms", "start->registered ms", "{:.0f}"),
    ("start_cpu_ms", "start CPU ms", "{:.0f}"),
    ("first_us", "first admission us", "{:.0f}"),
    ("p50_us", "admission p50 us", "{:.0f}"),
    ("p99_us", "admission p99 us", "{:.0f}"),
    ("cpu_us", "CPU us per admission", "{:.0f}"),
    ("rss_mib", "RSS MiB", "{:.1f}"),
    ("pss_mib", "PSS MiB", "{:.1f}"),
    ("idle_cpu_pct", "idle CPU %", "{:.3f}"),
)


def medians(samples: Sequence[Sample]) -> dict[str, dict[str, float]]:
    """target -> figure -> median over its rounds."""
    by_target: dict[str, list[Sample]] = {}
    for sample in samples:
        by_target.setdefault(sample.target, []).append(sample)
    return {target: {name: statistics.median(getattr(s, name) for s in rows) for name, _, _ in FIGURES}
            for target, rows in by_target.items()}


def ratio(ours: float, reference: float) -> float | None:
    """ours / reference, or None where the reference is zero (idle CPU often is)."""
    return ours / reference if reference > 0 else None


def table(summary: dict[str, dict[str, float]], reference: str = REFERENCE) -> list[str]:
    """Rows: one per figure; columns: each target, then ours/reference per target of ours."""
    targets = [reference, *(t for t in summary if t != reference)] if reference in summary else list(summary)
    ours = [t for t in targets if t != reference]
    head = ["figure (median)", *targets, *(f"{t}/ref" for t in ours if reference in summary)]
    rows = [head]
    for name, heading, fmt in FIGURES:
        row = [heading, *(fmt.format(summary[t][name]) for t in targets)]
        if reference in summary:
            for t in ours:
                r = ratio(summary[t][name], summary[reference][name])
                row.append(f"{r:.2f}x" if r is not None else "-")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


# ------------------------------------------------------------------ processes

class GoClient:
    """bench/go/kubelet-client on a socket directory, its JSON events read in a thread."""

    def __init__(self, binary: Path, socket_dir: str) -> None:
        self.proc = subprocess.Popen([str(binary), "-socket-dir", socket_dir], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.events: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.wait("listening", 10)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            for event in parse_events([line]):
                self.events.put(event)
        self.events.put({"event": "exited"})

    def wait(self, kind: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"kubelet-client: no {kind!r} event within {timeout:.0f} s")
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if event["event"] == kind:
                return event
            if event["event"] in ("error", "exited"):
                raise BenchError(f"kubelet-client: {event.get('error', 'exited')} (waiting for {kind})")

    def admit(self, warmup: int, count: int, size: int = 1) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"admit {warmup} {count} {size}\n")
        self.proc.stdin.flush()
        return self.wait("admissions", 120 + count / 100)

    def bulk(self, calls: int, size: int) -> list[str]:
        """`calls` concurrent Allocates of about `size` bytes each on the one connection: their codes."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"bulk {calls} {size}\n")
        self.proc.stdin.flush()
        return self.wait("bulk", 60)["codes"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)


def memory_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of a process; PSS splits shared pages among the processes mapping them."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])
    return fields["Rss"] / 1024, fields["Pss"] / 1024


NOTABLE = {"cygrpc": "grpcio", "_message.": "protobuf", "_upb": "protobuf", "_yaml": "PyYAML-C"}


def loaded_libraries(pid: int) -> str:
    """Which of grpcio/protobuf/PyYAML's native parts the process has mapped: says what it really runs on."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return ",".join(sorted({name for marker, name in NOTABLE.items() if marker in maps})) or "none"


def cpu_ms_precise(pid: int) -> float:
    """CPU time of every thread of a process so far, in ms (schedstat counts nanoseconds)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e6


@dataclass
class Running:
    """One target started for a round, with its own client, and what its admissions measured."""

    target: Target
    work: str
    client: GoClient
    proc: subprocess.Popen | None = None
    start_ms: float = 0.0
    start_cpu_ms: float = 0.0
    first_us: float = 0.0
    times_ns: list[int] = field(default_factory=list)
    cpu_ms: float = 0.0  # the plugin's CPU during its timed and warm-up admissions
    admitted: int = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None, "start() sets the process"
        return self.proc.pid

    def admit(self, count: int, timed: bool = True) -> None:
        """`count` admissions; their times are kept if `timed`, the plugin's CPU across them always."""
        cpu_before = cpu_ms_precise(self.pid)
        event = self.client.admit(0, count)
        self.cpu_ms += cpu_ms_precise(self.pid) - cpu_before
        self.admitted += count
        admission_figures(event)  # checks the event
        if timed:
            self.times_ns += event["ns"]

    def stop(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        finally:
            self.client.close()
            shutil.rmtree(self.work, ignore_errors=True)


def start(target: Target, client_binary: Path, args: argparse.Namespace) -> Running:
    """Start a target with a fresh client: start -> registered, and its first admission."""
    work = tempfile.mkdtemp(prefix="gdp-kb-", dir=args.work_root)
    socket_dir = os.path.join(work, "sock")
    os.makedirs(socket_dir)
    running = Running(target, work, GoClient(client_binary, socket_dir))
    try:
        argv = [a.replace("{socket_dir}", socket_dir).replace("{work}", work) for a in target.argv]
        env = {k: v.replace("{cache_root}", args.cache_root) for k, v in target.env.items()}
        if "CACHE_DIRECTORY" in env:
            os.makedirs(env["CACHE_DIRECTORY"], exist_ok=True)
        prepare(target.setup, work)
        started = time.time_ns()
        running.proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        registered = running.client.wait("registered", 30)
        running.start_cpu_ms = cpu_ms_precise(running.pid)
        running.start_ms = (registered["unix_ns"] - started) / 1e6
        running.first_us = running.client.admit(0, 1)["ns"][0] / 1000
    except BaseException:
        running.stop()
        raise
    return running


def slice_order(targets: Sequence[T], slices: int) -> list[list[T]]:
    """Which target runs when: every slice runs each target once, the order rotating from slice to
    slice, so no target always runs first (right after the others' admissions) or last."""
    n = len(targets)
    return [[targets[(i + k) % n] for k in range(n)] for i in range(slices)]


def measure_round(chosen: Sequence[Target], client_binary: Path, args: argparse.Namespace) -> list[Sample]:
    """One round: every target started afresh, one after the other; then their admissions in
    interleaved slices, so that each target's figures come from the same minutes of the machine
    (on a shared VM its speed drifts by tens of percent within a minute); then memory and idle CPU,
    all targets over the same window."""
    running: list[Running] = []
    try:
        for target in chosen:
            running.append(start(target, client_binary, args))
        if args.warmup:
            for r in running:
                r.admit(args.warmup, timed=False)
        per_slice = -(-args.admissions // args.slices)
        for order in slice_order(running, args.slices):
            for r in order:
                r.admit(per_slice)
        time.sleep(args.settle_seconds)  # let the admissions' garbage settle before reading memory
        memory = [(*memory_mib(r.pid), loaded_libraries(r.pid)) for r in running]
        # schedstat's nanoseconds, not /proc/PID/stat's clock ticks: a 10 ms tick charged to a
        # thread that happened to be running is alone 0.017 % of a minute
        cpu0 = [cpu_ms_precise(r.pid) for r in running]
        t0 = time.monotonic()
        time.sleep(args.idle_seconds)
        elapsed = time.monotonic() - t0
        load = os.getloadavg()[0]
        samples = []
        for r, (rss, pss, libraries), before in zip(running, memory, cpu0, strict=True):
            idle = (cpu_ms_precise(r.pid) - before) / 1000 / elapsed * 100
            p50, p99 = admission_figures({"event": "admissions", "ns": r.times_ns})
            samples.append(Sample(r.target.name, r.start_ms, r.start_cpu_ms, r.first_us, p50, p99,
                                  r.cpu_ms * 1000 / r.admitted, rss, pss, idle, load, libraries))
        return samples
    finally:
        for r in running:
            r.stop()


def prepare(setup: str, work: str) -> None:
    if setup == "simulated":
        os.makedirs(os.path.join(work, "health"))
    elif setup == "tegra":
        root = os.path.join(work, "nano")
        shutil.copytree(NANO_FIXTURE, root, symlinks=True)
        try:  # with a readable kernel log the monitor runs the select() loop a Jetson runs
            with open("/dev/kmsg", "rb"):
                pass
            os.symlink("/dev/kmsg", os.path.join(root, "dev", "kmsg"))
        except OSError:
            pass


def extra_target(spec: str) -> Target:
    """--plugin NAME=COMMAND: any other plugin, its command line split on spaces."""
    name, _, command = spec.partition("=")
    if not name or not command.strip() or name in (REFERENCE, "simulated", "tegra"):
        raise BenchError(f"--plugin {spec!r}: write NAME=COMMAND with a new NAME, e.g. "
                         "'other=/usr/bin/other-plugin --kubelet-socket {socket_dir}/kubelet.sock'")
    return Target(name, command.split())


_FLAGS = ["--kubelet-socket", "{socket_dir}/kubelet.sock", "--log-level", "info", "--health-recovery-period", "0"]
_SIMULATED = ["--config-file", str(IMAGE_CONFIGS / "qemuall" / "gpu-device-plugin.yaml"),
              "--simulated-health-dir", "{work}/health"]


def targets(python: str) -> list[Target]:
    env = {"PYTHONPATH": str(ROOT / "plugin" / "src"), "JOURNAL_STREAM": ""}
    # the unit's CacheDirectory, one per target kept across rounds: round 1 is a first start
    # (the config file parsed), later rounds restarts (its parsed copy read back)
    ours = [python, "-m", "gpu_device_plugin", *_FLAGS]
    return [
        Target(REFERENCE, [str(GO_BIN / "stub-plugin"), "-kubelet-socket", "{socket_dir}/kubelet.sock",
                           "-devices", "2"]),
        Target("simulated", [*ours, *_SIMULATED], {**env, "CACHE_DIRECTORY": "{cache_root}/simulated"}, "simulated"),
        # the Nano's own config: its runtime reads NVIDIA_VISIBLE_DEVICES only, and the plugin refuses a
        # hand-over the node's runtime ignores (the R39 config's volume mounts)
        Target("tegra", [*ours, "--config-file", str(IMAGE_CONFIGS / "tegra210" / "gpu-device-plugin.yaml"),
                         "--host-root", "{work}/nano"], {**env, "CACHE_DIRECTORY": "{cache_root}/tegra"}, "tegra"),
    ]


def variant_target(spec: str, python: str) -> Target:
    """--variant NAME=PATHS[=SCRIPT]: the simulated leg exactly (config file, health directory, cache,
    environment), with PATHS (os.pathsep-separated) as PYTHONPATH and, if given, `python SCRIPT`
    run instead of `python -m gpu_device_plugin`: another commit of the plugin, or another transport."""
    name, _, rest = spec.partition("=")
    paths, _, script = rest.partition("=")
    if not name or not paths or name in (REFERENCE, "simulated", "tegra"):
        raise BenchError(f"--variant {spec!r}: write NAME=PYTHONPATH[=SCRIPT] with a new NAME, e.g. "
                         "'before=/tmp/old/plugin/src'")
    entry = [script] if script else ["-m", "gpu_device_plugin"]
    return Target(name, [python, *entry, *_FLAGS, *_SIMULATED],
                  {"PYTHONPATH": paths, "JOURNAL_STREAM": "", "CACHE_DIRECTORY": "{cache_root}/" + name}, "simulated")


def compile_plugin(python: str) -> None:
    """Bytecode for the plugin's modules, as an image installs it: without it (PYTHONDONTWRITEBYTECODE,
    a read-only tree) every start compiles every module again, which is not what a node does."""
    subprocess.run([python, "-m", "compileall", "-q", str(ROOT / "plugin" / "src" / "gpu_device_plugin")],
                   check=True, stdout=subprocess.DEVNULL)


def python_stack(python: str) -> str:
    """The interpreter and the libraries installed beside it (whether the plugin loads them is
    what each round's "native libraries loaded" says)."""
    code = ("import sys, importlib.metadata as m\n"
            "def v(name):\n"
            "    try:\n        return m.version(name)\n"
            "    except m.PackageNotFoundError:\n        return 'absent'\n"
            "print(f'Python {sys.version.split()[0]} (installed: grpcio {v(\"grpcio\")}, protobuf {v(\"protobuf\")}, '"
            " f'PyYAML {v(\"PyYAML\")})')")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"{python} does not run: {done.stderr.strip()[-200:]}")
    return done.stdout.strip()


def default_work_root() -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="fresh starts of every target (medians over them)")
    parser.add_argument("--admissions", type=int, default=1000, help="timed admissions per target and round")
    parser.add_argument("--warmup", type=int, default=200, help="untimed admissions first (connection, caches)")
    parser.add_argument("--slices", type=int, default=10,
                        help="the timed admissions of a round run in this many slices, targets taking turns")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle CPU window per target and round")
    parser.add_argument("--settle-seconds", type=float, default=2.0, help="pause before reading memory")
    parser.add_argument("--target", action="append",
                        help="only these targets (repeatable; default all): go-reference, simulated, tegra, "
                        "or a --plugin NAME")
    parser.add_argument("--plugin", action="append", default=[], metavar="NAME=COMMAND",
                        help="also measure this plugin; {socket_dir} in COMMAND is the kubelet's socket directory")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=PYTHONPATH[=SCRIPT]",
                        help="also measure the simulated leg run from PYTHONPATH (another commit of the plugin), "
                        "through SCRIPT if given (bench/h2lib_candidate.py: the plugin on python-hyper's h2)")
    parser.add_argument("--python", default=sys.executable, help="interpreter our plugin runs on")
    parser.add_argument("--json", metavar="PATH", help="also write every round's figures here")
    parser.add_argument("--work-root", default=default_work_root(),
                        help="where each round's sockets and the device manager's checkpoint live (default: tmpfs "
                        "/dev/shm where there is one: the manager writes and fsyncs its checkpoint at every "
                        "admission, and a disk's flush would be measured instead of the plugins)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.admissions < 1 or args.slices < 1 or args.warmup < 0:
        parser.error("--rounds, --admissions and --slices take 1 or more, --warmup 0 or more")
    args.cache_root = tempfile.mkdtemp(prefix="gdp-kb-cache-", dir="/tmp")
    try:
        return run(args)
    finally:
        shutil.rmtree(args.cache_root, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    client = GO_BIN / "kubelet-client"
    if not client.exists() or not (GO_BIN / "stub-plugin").exists():
        print(f"error: {client} is not built. fix: bench/go/build.sh (needs Go; it builds conformance/'s "
              "programs from the Go module proxy)", file=sys.stderr)
        return 2
    try:
        stack = python_stack(args.python)
        compile_plugin(args.python)
        go_stack = (GO_BIN / "stack.txt").read_text().strip() if (GO_BIN / "stack.txt").exists() else "go"
        print(f"client: the kubelet's device manager ({go_stack}); reference: Kubernetes' device plugin stub "
              f"({go_stack}); ours: {stack}")
        print(f"{os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}; our round 1 is a first "
              "start (config file parsed), later rounds restarts (its parsed copy read back); sockets and the "
              f"manager's checkpoint in {args.work_root}")
        every = [*targets(args.python), *(extra_target(spec) for spec in args.plugin),
                 *(variant_target(spec, args.python) for spec in args.variant)]
        chosen = [t for t in every if not args.target or t.name in args.target]
        if not chosen:
            raise BenchError(f"no target named {', '.join(args.target)}: choose from "
                             f"{', '.join(t.name for t in every)}")
        samples = []
        for round_number in range(1, args.rounds + 1):
            for sample in measure_round(chosen, client, args):
                samples.append(sample)
                print(f"round {round_number} {sample.target}: start {sample.start_ms:.0f} ms "
                      f"({sample.start_cpu_ms:.0f} ms CPU), first admission {sample.first_us:.0f} us, admission p50 "
                      f"{sample.p50_us:.0f} us p99 {sample.p99_us:.0f} us ({sample.cpu_us:.0f} us CPU), "
                      f"RSS {sample.rss_mib:.1f} MiB "
                      f"(PSS {sample.pss_mib:.1f}), idle CPU {sample.idle_cpu_pct:.3f} %, load {sample.load:.2f}, "
                      f"native libraries loaded: {sample.libraries}",
                      flush=True)
    except BenchError as failure:
        print(f"error: {failure}", file=sys.stderr)
        return 1
    print("\n".join(table(medians(samples))))
    print(f"load average at the end {os.getloadavg()[0]:.2f} (p99 and start figures follow the load)")
    if args.json:
        Path(args.json).write_text(json.dumps({"stack": stack, "go": go_stack,
                                               "samples": [s.__dict__ for s in samples]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
