"""The policy core stays apart from the CLI: importing it loads no argument parsing; what a
start loads stays lean (each of these cost milliseconds of every start, bench/kubelet_bench.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "plugin" / "src"


def test_the_policy_core_does_not_import_the_cli_or_argparse() -> None:
    probe = ("import sys, gpu_device_plugin.core.policy, gpu_device_plugin.service.servicer, "
             "gpu_device_plugin.core.state; "
             "print(sorted(m for m in ('argparse', 'gpu_device_plugin.cli.main', 'gpu_device_plugin.config.loader') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(SRC)}, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_serve_path_imports_nothing_a_start_does_not_need() -> None:
    # dataclasses pulls in inspect and ast; yaml is read from config.cache's copy; the rest
    # only on request (NVML, the metrics listener and its GPU telemetry, hashlib for cdi-annotations,
    # tempfile to write a CDI spec, asyncio)
    probe = ("import sys\n"
             "from gpu_device_plugin.cli import main, serve\n"
             "from gpu_device_plugin.discovery import tegra, simulated\n"
             "from gpu_device_plugin.health import tegra as t, simulated as s\n"
             "print(sorted(m for m in ('dataclasses', 'inspect', 'ast', 'yaml', 'pynvml', 'http.server', 'hashlib',"
             " 'ssl', 'asyncio', 'grpc', 'google.protobuf', 'tempfile', 'gpu_device_plugin.metrics')"
             " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(SRC)}, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_two_classes_share_a_name_and_one_module_is_the_policy() -> None:
    package = SRC / "gpu_device_plugin"
    modules = [p for p in package.rglob("*.py") if "__pycache__" not in p.parts]
    classes: dict[str, list[str]] = {}
    for module in modules:
        for line in module.read_text().splitlines():
            if line.startswith("class "):
                name = line[len("class "):].split("(")[0].split(":")[0]
                classes.setdefault(name, []).append(str(module.relative_to(package)))
    assert {name: where for name, where in classes.items() if len(where) > 1} == {}
    assert [str(p.relative_to(package)) for p in modules if p.stem == "policy"] == ["core/policy.py"]


def test_gpu_telemetry_reads_the_kubelet_and_the_hardware_without_grpcio_protobuf_or_eager_nvml() -> None:
    probe = ("import sys\n"
             "from gpu_device_plugin.metrics import telemetry, podresources, tegra, nvml, table\n"
             "from gpu_device_plugin import observability\n"
             "print(sorted(m for m in ('grpc', 'google.protobuf', 'pynvml', 'http.server') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(SRC)}, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_metrics_listener_loads_no_http_library_and_no_tls() -> None:
    # http.server imports http.client, which loads ssl and OpenSSL: ~7 MiB for two plain-text paths
    probe = ("import socket, sys\n"
             "from gpu_device_plugin.observability.endpoint import Status, StatusServer\n"
             "status = Status('v', 'simulated', 'nvidia.com/gpu', 1, 0, True, 1, True, 1, 0, 0, 0, 0, 0, 0)\n"
             "server = StatusServer('127.0.0.1:0', lambda: status)\n"
             "server.start()\n"
             "conn = socket.create_connection(('127.0.0.1', server.port))\n"
             "conn.sendall(b'GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
             "answer = b''.join(iter(lambda: conn.recv(65536), b''))\n"
             "server.stop()\n"
             "print(answer.split(b'\\r\\n', 1)[0].decode(), sorted(m for m in ('ssl', 'http.client', "
             "'http.server', 'email') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(SRC)}, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "HTTP/1.1 200 OK []"
