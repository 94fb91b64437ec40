"""/healthz and /metrics: pure rendering, then the real listener on loopback."""

from __future__ import annotations

import shutil
import socket
import urllib.error
import urllib.request

from gpu_device_plugin.observability.endpoint import (
    Status,
    StatusServer,
    health_status,
    http_response,
    metrics_body,
    parse_request_line,
    render_metrics,
    route,
)
from gpu_device_plugin.observability.node import node_name
from helpers import run_simulated, short_tempdir, wait_until
from kubelet_double import KubeletDouble

SERVING = Status(version="0.1.0", backend="simulated", resource="nvidia.com/gpu", healthy_devices=2,
                 unhealthy_devices=0, registered=True, streams=1, monitor_alive=True, registrations=1,
                 registration_failures=0, kubelet_restarts=0, allocations=3, health_events=0, config_reloads=0,
                 config_rejections=0)


def test_healthz_is_ok_only_while_registered_with_a_live_stream() -> None:
    assert health_status(SERVING) == (200, "ok")
    code, reason = health_status(SERVING._replace(registered=False))
    assert code == 503 and "not registered" in reason
    code, reason = health_status(SERVING._replace(streams=0))
    assert code == 503 and "no ListAndWatch stream" in reason
    code, reason = health_status(SERVING._replace(monitor_alive=False))
    assert code == 503 and "health monitor stopped" in reason


def test_healthz_is_ok_on_a_node_without_gpus() -> None:
    assert health_status(SERVING._replace(healthy_devices=0, registered=False, streams=0))[0] == 200


def test_metrics_expose_devices_by_health_and_counters() -> None:
    text = render_metrics(SERVING._replace(healthy_devices=1, unhealthy_devices=1, kubelet_restarts=2))
    assert 'gpu_device_plugin_devices{resource="nvidia.com/gpu",health="unhealthy"} 1' in text
    assert "gpu_device_plugin_allocations_total 3" in text
    assert "gpu_device_plugin_kubelet_restarts_total 2" in text
    assert "# TYPE gpu_device_plugin_registrations_total counter" in text


def test_every_plugin_series_carries_the_nodes_hostname_as_the_gpu_series_do() -> None:
    """So a dashboard's node filter (Hostname, dcgm-exporter's label) selects the plugin's health too."""
    text = render_metrics(SERVING._replace(node='orin-"7"'))
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert samples and all('Hostname="orin-\\"7\\""' in line for line in samples), samples
    assert 'gpu_device_plugin_devices{resource="nvidia.com/gpu",health="healthy",Hostname="orin-\\"7\\""} 2' in text
    assert 'gpu_device_plugin_list_and_watch_streams{Hostname="orin-\\"7\\""} 1' in text


class GpuMetrics:
    def __init__(self, text: str = "", error: Exception | None = None) -> None:
        self.text, self.error, self.closed = text, error, False

    def render(self) -> str:
        if self.error is not None:
            raise self.error
        return self.text

    def close(self) -> None:
        self.closed = True


def test_gpu_metrics_follow_the_plugins_own_and_a_failing_read_never_costs_them() -> None:
    own = render_metrics(SERVING)
    assert metrics_body(SERVING, None) == own
    gpu_line = 'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 5\n'
    assert metrics_body(SERVING, GpuMetrics(gpu_line)) == own + gpu_line
    assert metrics_body(SERVING, GpuMetrics(error=OSError("sysfs went away"))) == own


def test_requests_are_routed_and_answered_as_http_clients_expect() -> None:
    assert route("GET", "/healthz", lambda: SERVING, None) == (200, "text/plain; charset=utf-8", "ok\n")
    code, ctype, body = route("GET", "/metrics?x=1", lambda: SERVING, GpuMetrics("DCGM_X 1\n"))
    assert (code, ctype) == (200, "text/plain; version=0.0.4; charset=utf-8") and body.endswith("DCGM_X 1\n")
    assert route("POST", "/metrics", lambda: SERVING, None)[0] == 405
    assert route("GET", "/nope", lambda: SERVING, None)[0] == 404
    assert http_response(200, "text/plain", "ok\n") == (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
    head = http_response(200, "text/plain", "ok\n", head_only=True)
    assert head.endswith(b"Content-Length: 3\r\nConnection: close\r\n\r\n")
    assert parse_request_line(b"GET /metrics HTTP/1.1\r\n") == ("GET", "/metrics")
    assert parse_request_line(b"\x16\x03\x01 tls hello") is None and parse_request_line(b"") is None


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return data


def test_a_stalled_client_holds_no_one_else_up_and_garbage_gets_400() -> None:
    server = StatusServer("127.0.0.1:0", lambda: SERVING)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port)):  # connects, never sends
            assert get(f"http://127.0.0.1:{server.port}/healthz") == (200, "ok\n")
        assert raw(server.port, b"BLAH\r\n\r\n").startswith(b"HTTP/1.1 400 Bad Request\r\n")
        answer = raw(server.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\n")
    finally:
        server.stop()


def test_stopping_the_listener_closes_the_gpu_metrics_source() -> None:
    source = GpuMetrics("")
    server = StatusServer("127.0.0.1:0", lambda: SERVING, source)
    server.start()
    assert get(f"http://127.0.0.1:{server.port}/metrics")[0] == 200
    server.stop()
    assert source.closed


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_listener_reports_live_state_of_the_running_daemon() -> None:
    socket_dir = short_tempdir()
    kubelet = KubeletDouble(socket_dir)
    try:
        runner = run_simulated(socket_dir, metrics_address="127.0.0.1:0")
        with runner as daemon:
            assert wait_until(lambda: daemon.status_port is not None), "the listener never started"
            base = f"http://127.0.0.1:{daemon.status_port}"
            code, body = get(f"{base}/healthz")
            assert code == 503 and "not registered" in body  # no kubelet yet
            kubelet.start()
            endpoint = kubelet.wait_registered()
            # The kubelet has the registration (and dials back, streams, allocates) before Register's
            # answer reaches the plugin: only then does the plugin know, and /healthz say, it is registered.
            assert daemon.registered_event.wait(10), "the plugin never saw Register succeed"
            endpoint.wait_for(lambda d: len(d) == 2)
            endpoint.allocate(["sim-gpu-0"])
            assert get(f"{base}/healthz") == (200, "ok\n")
            code, metrics = get(f"{base}/metrics")
            assert code == 200
            node = node_name()
            assert f'gpu_device_plugin_devices{{resource="nvidia.com/gpu",health="healthy",Hostname="{node}"}} 2' \
                in metrics
            assert f'gpu_device_plugin_allocations_total{{Hostname="{node}"}} 1' in metrics
            assert get(f"{base}/nope")[0] == 404
        assert runner.result == [0]
    finally:
        kubelet.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_an_address_without_host_listens_on_loopback_only() -> None:
    server = StatusServer(":0", lambda: SERVING)
    server.start()
    try:
        assert server.host == "127.0.0.1"
        assert get(f"http://127.0.0.1:{server.port}/healthz") == (200, "ok\n")
    finally:
        server.stop()
