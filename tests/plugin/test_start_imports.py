"""What a start loads stays lean: the serve path imports no module it does not need at start
(each of these cost milliseconds of every start, bench/kubelet_bench.py), and the policy core
loads no argument parsing. Which folder may import which is test_module_layout.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "plugin" / "src"


def loaded_after(probe: str, names: tuple[str, ...]) -> list[str]:
    """Which of `names` a fresh interpreter has loaded after running `probe`."""
    code = probe + f"import json, sys\nprint(json.dumps(sorted(m for m in {names!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(SRC)}, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def test_the_policy_core_does_not_import_the_cli_or_argparse() -> None:
    probe = "import gpu_device_plugin.core.policy, gpu_device_plugin.service.servicer, gpu_device_plugin.core.state\n"
    assert loaded_after(probe, ("argparse", "gpu_device_plugin.cli.main", "gpu_device_plugin.config.loader")) == []


# What `gpu-device-plugin` (the unit's ExecStart) imports before it serves, as the start imports it.
SERVE_PATH = ("from gpu_device_plugin.cli import main, serve\n"
              "from gpu_device_plugin.discovery import tegra, simulated\n"
              "from gpu_device_plugin.health import tegra as t, simulated as s\n")
# dataclasses pulls in inspect and ast; yaml is read from config.cache's copy; the rest only on
# request: NVML, the metrics listener (socketserver) and its GPU telemetry, hashlib for
# cdi-annotations, tempfile to write a CDI spec, the reload plan, the node doctor; never asyncio,
# grpcio or protobuf
NOT_AT_START = ("dataclasses", "inspect", "ast", "yaml", "pynvml", "http.server", "socketserver", "hashlib", "ssl",
                "asyncio", "grpc", "google.protobuf", "tempfile", "gpu_device_plugin.metrics",
                "gpu_device_plugin.observability.endpoint", "gpu_device_plugin.config.reload_policy",
                "gpu_device_plugin.doctor")
# ...while the probe really loads the serve path: the session's parts, the gRPC service and server
SERVE_MODULES = ("gpu_device_plugin.session.daemon", "gpu_device_plugin.session.kubelet",
                 "gpu_device_plugin.session.reload", "gpu_device_plugin.session.supervision",
                 "gpu_device_plugin.service.server", "gpu_device_plugin.service.servicer",
                 "gpu_device_plugin.api.grpc_server", "gpu_device_plugin.config.loader",
                 "gpu_device_plugin.cdi.lifecycle", "gpu_device_plugin.observability.readiness")


def test_the_serve_path_imports_nothing_a_start_does_not_need() -> None:
    assert loaded_after(SERVE_PATH, NOT_AT_START) == []


def test_the_serve_path_probe_loads_what_a_start_runs() -> None:
    # a probe that no longer reaches the session would pass the test above whatever the session imports
    assert loaded_after(SERVE_PATH, SERVE_MODULES) == sorted(SERVE_MODULES)


def test_the_start_probe_sees_a_heavy_import() -> None:
    # the probe can fail: a module importing protobuf at import time (api/pb, for Python clients) is seen
    assert loaded_after(SERVE_PATH + "import gpu_device_plugin.api.pb\n", ("google.protobuf",)) == ["google.protobuf"]


def test_gpu_telemetry_reads_the_kubelet_and_the_hardware_without_grpcio_protobuf_or_eager_nvml() -> None:
    probe = ("from gpu_device_plugin.metrics import telemetry, podresources, tegra, nvml, table\n"
             "from gpu_device_plugin import observability\n")
    assert loaded_after(probe, ("grpc", "google.protobuf", "pynvml", "http.server")) == []


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
