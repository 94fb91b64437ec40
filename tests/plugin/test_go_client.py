"""The benchmark's run through the kubelet's own device manager (bench/kubelet_bench.py).

Only where Go is installed (bench/go/build.sh builds the client and Kubernetes' reference stub from
the Go module proxy, into the build caches the conformance leg of ./task test shares); elsewhere it
skips. Figures are not asserted, only that every target registers and is admitted. What the
device manager ends up with is asserted by the conformance harness (conformance/, a leg of its own).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def go_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain for the benchmark's client (bench/go/build.sh)")
    out = tmp_path_factory.mktemp("bench-go")
    done = subprocess.run([str(ROOT / "bench" / "go" / "build.sh")], env={**os.environ, "BENCH_GO_OUT": str(out)},
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out / "bin"


def load_bench(go_bin: Path):
    spec = importlib.util.spec_from_file_location("kubelet_bench_go", ROOT / "bench" / "kubelet_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.GO_BIN = go_bin
    return module


def test_the_kubelets_device_manager_admits_through_both_backends_and_the_reference(go_bin: Path, capsys) -> None:
    bench = load_bench(go_bin)
    try:
        code = bench.main(["--rounds", "1", "--admissions", "30", "--warmup", "5", "--idle-seconds", "0.2",
                           "--settle-seconds", "0"])
    finally:
        sys.modules.pop("kubelet_bench_go", None)
    out = capsys.readouterr()
    assert code == 0, out.err
    for target in ("go-reference", "simulated", "tegra"):
        assert f"round 1 {target}: start" in out.out
    assert "simulated/ref" in out.out and "tegra/ref" in out.out
    assert "k8s.io/kubernetes v1.36" in out.out


@pytest.mark.parametrize(("calls", "size"), [(2, 3_100_000), (4, 1_200_000)], ids=["2x3.1MB", "4x1.2MB"])
def test_concurrent_multi_megabyte_allocates_on_one_grpc_go_connection_are_all_answered(
        go_bin: Path, calls: int, size: int) -> None:
    """Issue 36, defect 1: credit came back only once a whole request was consumed, and the connection
    window held one largest message, so two 3.1 MB (or four 1.2 MB) requests sent together each got
    part of the window and waited forever for more. Every call must reach the handler (which refuses
    the made-up device IDs: INVALID_ARGUMENT), none may run into its deadline. The client is grpc-go
    as the kubelet links it (conformance/go.mod), on one connection to the plugin's socket."""
    bench = load_bench(go_bin)
    socket_dir = tempfile.mkdtemp(prefix="gdp-go-", dir="/tmp")
    client = bench.GoClient(go_bin / "kubelet-client", socket_dir)
    plugin = subprocess.Popen([sys.executable, "-m", "gpu_device_plugin", "--kubelet-socket",
                               f"{socket_dir}/kubelet.sock", "--device-discovery-strategy", "simulated",
                               "--simulated-gpus", "2"],
                              env={**os.environ, "PYTHONPATH": str(ROOT / "plugin" / "src")},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        client.wait("registered", 30)
        assert client.bulk(calls, size) == ["InvalidArgument"] * calls
        assert len(client.admit(0, 5, 1)["ns"]) == 5, "the plugin still admits after them"
    finally:
        plugin.terminate()
        _, stderr = plugin.communicate(timeout=10)
        client.close()
        sys.modules.pop("kubelet_bench_go", None)
        shutil.rmtree(socket_dir, ignore_errors=True)
    assert "Traceback" not in stderr, stderr
