"""The agent rings' prepare step: wait until the server ring's (and the canary ring's) Plan
completed this very version."""

from __future__ import annotations

import http.server
import json
import shutil
import ssl
import subprocess
import threading

import pytest
from fake_board import describe, run_agent
from gpu_k8s_update import plans


def plan(latest: str, complete: str | None, applying: list[str] | None = None) -> dict:
    conditions = [{"type": "LatestResolved", "status": "True"}]
    if complete is not None:
        conditions.append({"type": "Complete", "status": complete})
    return {"status": {"latestVersion": latest, "conditions": conditions, "applying": applying or []}}


def test_only_a_completed_plan_at_this_version_lets_the_ring_start() -> None:
    assert plans.plan_state(plan("1.1.0", "True"), "1.1.0") == (True, "complete")
    done, detail = plans.plan_state(plan("1.0.0", "True"), "1.1.0")
    assert not done and "version 1.0.0" in detail, "a canary complete for the previous version proves nothing"
    done, detail = plans.plan_state(plan("1.1.0", "False", ["nano-canary"]), "1.1.0")
    assert not done and "nano-canary" in detail
    assert plans.plan_state(plan("1.1.0-rc.1", "True"), "1.1.0+rc.1")[0], "SUC stores '+' as '-'"


def test_wait_polls_until_complete_and_logs_each_new_state(caplog: pytest.LogCaptureFixture) -> None:
    answers = iter([plan("1.0.0", "True"), plan("1.1.0", "False", ["c1"]), plan("1.1.0", "False", ["c1"]),
                    plan("1.1.0", "True")])
    sleeps: list[float] = []
    caplog.set_level("INFO")
    code = plans.wait_for_plan(lambda: next(answers), "1.1.0", "gpu-k8s-os-canary", sleeps.append, 15)
    assert code == 0 and len(sleeps) == 3
    waits = [r.message for r in caplog.records if "waiting for" in r.message]
    assert len(waits) == 2, "an unchanged state is not logged again"


def test_api_errors_are_waited_out(caplog: pytest.LogCaptureFixture) -> None:
    calls = {"n": 0}

    def flaky() -> dict:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("connection refused")
        return plan("1.1.0", "True")

    caplog.set_level("INFO")
    assert plans.wait_for_plan(flaky, "1.1.0", "p", lambda s: None, 1) == 0
    assert any("cannot read Plan p" in r.message for r in caplog.records)


def test_wait_plan_without_credentials_is_a_one_line_usage_error(tmp_path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(plans.__file__).rsplit("/gpu_k8s_update/", 1)[0]}
    result = run_agent(env, "wait-plan", "--plan", "gpu-k8s-os-canary", "--version", "1.1.0")
    assert result.returncode == 2, describe(result)
    assert "GPU_K8S_UPDATE_API_TOKEN" in result.stderr


def test_wait_plan_reads_the_plan_over_tls_with_the_service_account(tmp_path) -> None:
    """End to end through the CLI: HTTPS with the pod's CA, the bearer token, the Plan's URL."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    seen: list[tuple[str, str]] = []

    class Api(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization", "")))
            body = json.dumps(plan("1.1.0", "True")).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Api)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(plans.__file__).rsplit("/gpu_k8s_update/", 1)[0],
               "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.server_address[1]),
               "GPU_K8S_UPDATE_API_TOKEN": "sa-token", "GPU_K8S_UPDATE_API_CA": cert.read_text()}
        result = run_agent(env, "wait-plan", "--plan", "gpu-k8s-os-server", "--plan", "gpu-k8s-os-canary",
                           "--version", "1.1.0", timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, describe(result)
    assert seen == [("/apis/upgrade.cattle.io/v1/namespaces/system-upgrade/plans/gpu-k8s-os-server",
                     "Bearer sa-token"),
                    ("/apis/upgrade.cattle.io/v1/namespaces/system-upgrade/plans/gpu-k8s-os-canary",
                     "Bearer sa-token")], "each Plan in turn"
