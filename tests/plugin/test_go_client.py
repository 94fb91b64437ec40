"""The plugin as a Go client (grpc-go, as the kubelet) sees it, through bench/kubelet_bench.py.

Only where Debian's Go toolchain and grpc-go are installed (bench/go/build.sh says which
packages); elsewhere these tests skip. Figures are not asserted, only that every call works.
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
NEEDED = ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")


@pytest.fixture(scope="module")
def go_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing or not Path("/usr/share/gocode/src/google.golang.org/grpc").is_dir():
        pytest.skip(f"no Go toolchain for the benchmark client ({', '.join(missing) or 'grpc-go'} missing)")
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


def test_the_go_kubelet_client_admits_through_both_backends_and_the_reference(go_bin: Path, capsys) -> None:
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


def test_a_device_list_above_64_kib_reaches_grpc_go_through_its_window_growth(go_bin: Path, tmp_path: Path) -> None:
    """grpc-go starts a stream with a 64 KiB window and grows it from BDP pings (PING frames sent as
    data arrives, then SETTINGS_INITIAL_WINDOW_SIZE and WINDOW_UPDATE): a 4,096-device list (~120 KiB)
    must arrive whole, and so must the list after a health change, with admissions working after."""
    bench = load_bench(go_bin)
    config = tmp_path / "many.yaml"
    config.write_text("version: v1\nflags:\n  deviceDiscoveryStrategy: simulated\n  plugin:\n    simulatedGpus: 64\n"
                      "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 64\n")
    socket_dir = tempfile.mkdtemp(prefix="gdp-go-", dir="/tmp")
    health = tmp_path / "health"
    health.mkdir()
    client = bench.GoClient(go_bin / "kubelet-client", socket_dir)
    plugin = subprocess.Popen([sys.executable, "-m", "gpu_device_plugin", "--kubelet-socket",
                               f"{socket_dir}/kubelet.sock", "--config-file", str(config),
                               "--simulated-health-dir", str(health), "--health-recovery-period", "0"],
                              env={**os.environ, "PYTHONPATH": str(ROOT / "plugin" / "src")},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        client.wait("registered", 30)
        first = client.wait("devices", 30)
        assert (first["count"], first["healthy"]) == (4096, 4096)
        (health / "sim-gpu-7").write_text("Unhealthy")
        changed = client.wait("devices", 30)
        assert (changed["count"], changed["healthy"]) == (4096, 4096 - 64), "the list after a change, whole"
        result = client.admit(5, 50, 2)
        assert len(result["ns"]) == 50
    finally:
        plugin.terminate()
        _, stderr = plugin.communicate(timeout=10)
        client.close()
        sys.modules.pop("kubelet_bench_go", None)
        shutil.rmtree(socket_dir, ignore_errors=True)
    assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize(("calls", "size"), [(2, 3_100_000), (4, 1_200_000)], ids=["2x3.1MB", "4x1.2MB"])
def test_concurrent_multi_megabyte_allocates_on_one_grpc_go_connection_are_all_answered(
        go_bin: Path, calls: int, size: int) -> None:
    """Issue 36, defect 1: credit came back only once a whole request was consumed, and the connection
    window held one largest message, so two 3.1 MB (or four 1.2 MB) requests sent together each got
    part of the window and waited forever for more. Every call must reach the handler (which refuses
    the made-up device IDs: INVALID_ARGUMENT), none may run into its deadline."""
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
        client.wait("devices", 30)
        assert client.bulk(calls, size) == ["InvalidArgument"] * calls
        assert len(client.admit(0, 5, 1)["ns"]) == 5, "the connection still admits after them"
    finally:
        plugin.terminate()
        _, stderr = plugin.communicate(timeout=10)
        client.close()
        sys.modules.pop("kubelet_bench_go", None)
        shutil.rmtree(socket_dir, ignore_errors=True)
    assert "Traceback" not in stderr, stderr
