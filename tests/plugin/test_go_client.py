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
