"""/healthz and /metrics: pure rendering, then the real listener on loopback."""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request

from gpu_device_plugin.observability import Status, health_status, render_metrics
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
            deadline = time.monotonic() + 5
            while daemon.status_port is None and time.monotonic() < deadline:
                time.sleep(0.01)
            base = f"http://127.0.0.1:{daemon.status_port}"
            code, body = get(f"{base}/healthz")
            assert code == 503 and "not registered" in body  # no kubelet yet
            kubelet.start()
            endpoint = kubelet.wait_registered()
            endpoint.wait_for(lambda d: len(d) == 2)
            endpoint.allocate(["sim-gpu-0"])
            # the kubelet has the plugin once Register dialled back; the plugin counts itself registered
            # when Register's answer reaches it, which a loaded machine may deliver a moment later
            assert wait_until(lambda: get(f"{base}/healthz") == (200, "ok\n"), 10)
            code, metrics = get(f"{base}/metrics")
            assert code == 200
            assert 'gpu_device_plugin_devices{resource="nvidia.com/gpu",health="healthy"} 2' in metrics
            assert "gpu_device_plugin_allocations_total 1" in metrics
            assert get(f"{base}/nope")[0] == 404
        assert runner.result == [0]
    finally:
        kubelet.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_an_address_without_host_listens_on_loopback_only() -> None:
    from gpu_device_plugin.observability import StatusServer

    server = StatusServer(":0", lambda: SERVING)
    server.start()
    try:
        assert server.host == "127.0.0.1"
        assert get(f"http://127.0.0.1:{server.port}/healthz") == (200, "ok\n")
    finally:
        server.stop()
