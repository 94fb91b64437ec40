"""The kubelet's admissions and the plugin's memory while hostile peers share its socket (issue 36).

Run (after bench/go/build.sh):
    .venvs/plugin-oldest/bin/python bench/hostile_bench.py [--admissions 1000] [--slow 25x100]

The plugin runs as a process (64 simulated GPUs x 4 replicas) with bench/go/kubelet-client as
the kubelet. Then, all at once and sustained until the admissions are done:
- a reset storm: a client opening ListAndWatch and Allocate streams and resetting each at once,
  in batches, reconnecting whenever the plugin sends it away;
- slow streams: `--slow CxS` connections with S Allocate streams each, every one with a 64 KiB
  head of a larger message sent and the rest never, no connection ever reading.
Meanwhile the kubelet client makes `--admissions` admissions (GetPreferredAllocation + Allocate)
on its own connection. Printed: their p50/p99 beside the same client's with nobody else there,
the plugin's RSS and peak, and its RSS once the hostile peers are gone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugin" / "src"), str(ROOT / "tests" / "plugin")]

from abuse_bench import load_kubelet_bench, memory  # noqa: E402  # the same kubelet double and /proc reading
from h2_peer import (  # noqa: E402
    ALLOCATE,
    DATA,
    END_STREAM,
    LIST_AND_WATCH,
    Peer,
    frame,
    grpc_message,
    request_fields,
    rst_stream,
)


def reset_storm(path: str, stop: threading.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        try:
            peer = Peer(path)
            stream = 1
            while not stop.is_set():
                batch = []
                for _ in range(50):
                    route = LIST_AND_WATCH if stream % 4 == 1 else ALLOCATE
                    batch += [peer.headers(stream, request_fields(route)),
                              frame(DATA, END_STREAM, stream, grpc_message(b"")), rst_stream(stream, 8)]
                    stream += 2
                peer.send(*batch)
                counts["reset"] += 50
                peer.sock.settimeout(0)
                try:  # read what came, never wait for it
                    while peer.sock.recv(1 << 16):
                        pass
                except OSError:
                    pass
        except OSError:
            counts["sent away"] += 1
            time.sleep(0.01)


def slow_streams(path: str, streams: int, held: list[Peer]) -> None:
    peer = Peer(path)
    head = grpc_message(b"\x0a" * 200_000)[:16384]  # the first 16 KiB of a 200 KB message
    for n in range(streams):
        stream = 1 + 2 * n
        try:
            peer.send(peer.headers(stream, request_fields(ALLOCATE)),
                      *(frame(DATA, 0, stream, head) for _ in range(4)))
        except OSError:
            break
    held.append(peer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admissions", type=int, default=1000)
    parser.add_argument("--slow", default="25x100", help="CONNECTIONSxSTREAMS of slow Allocates")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--pythonpath", default=str(ROOT / "plugin" / "src"), help="the plugin's source to run")
    args = parser.parse_args(argv)
    connections, streams = (int(part) for part in args.slow.split("x"))
    kb = load_kubelet_bench()
    work = tempfile.mkdtemp(prefix="gdp-hostile-", dir="/tmp")
    socket_dir = os.path.join(work, "sock")
    os.makedirs(socket_dir)
    config = Path(work, "config.yaml")
    config.write_text("version: v1\nflags:\n  deviceDiscoveryStrategy: simulated\n  plugin:\n    simulatedGpus: 64\n"
                      "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n")
    client = kb.GoClient(kb.GO_BIN / "kubelet-client", socket_dir)
    plugin = subprocess.Popen([args.python, "-m", "gpu_device_plugin", "--kubelet-socket",
                               f"{socket_dir}/kubelet.sock", "--config-file", str(config), "--log-level", "warning"],
                              env={**os.environ, "PYTHONPATH": args.pythonpath, "JOURNAL_STREAM": ""},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    held: list[Peer] = []
    try:
        client.wait("registered", 30)
        client.wait("devices", 30)
        path = next(os.path.join(socket_dir, n) for n in os.listdir(socket_dir) if n != "kubelet.sock")
        print(f"plugin: {kb.python_stack(args.python)}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        quiet = kb.admission_figures(client.admit(200, args.admissions, 1))
        print(f"alone:    admission p50 {quiet[0]:.0f} us, p99 {quiet[1]:.0f} us; RSS {memory(plugin.pid)[0]:.1f} MiB")
        counts = {"reset": 0, "sent away": 0}
        storm = threading.Thread(target=reset_storm, args=(path, stop, counts), daemon=True)
        storm.start()
        for _ in range(connections):
            slow_streams(path, streams, held)
        hostile = kb.admission_figures(client.admit(0, args.admissions, 1))
        rss, peak = memory(plugin.pid)
        print(f"hostile:  admission p50 {hostile[0]:.0f} us, p99 {hostile[1]:.0f} us; RSS {rss:.1f} MiB, "
              f"peak {peak:.1f} MiB ({counts['reset']} streams opened and reset, sent away {counts['sent away']} "
              f"times; "
              f"{connections}x{streams} slow streams; load {os.getloadavg()[0]:.2f})")
        stop.set()
        storm.join(5)
        for peer in held:
            peer.close()
        time.sleep(2)
        client.admit(0, 10, 1)
        print(f"after:    RSS {memory(plugin.pid)[0]:.1f} MiB once the hostile peers are gone")
    finally:
        stop.set()
        plugin.terminate()
        plugin.wait(10)
        client.close()
        sys.modules.pop("kubelet_bench_hostile", None)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
