"""Boot never waits on the kubelet: READY once serving, then STATUS lines say what the plugin waits for."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import grpc
import pytest
from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.session.daemon import Daemon
from helpers import RunningDaemon, wait_until
from kubelet_double import KubeletDouble


class NotifySink:
    """systemd's end of $NOTIFY_SOCKET: every datagram the plugin sends, in order."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(5)
        self.messages: list[str] = []

    def until(self, predicate) -> str:
        while True:
            message = self.sock.recv(4096).decode()
            self.messages.append(message)
            if predicate(message):
                return message

    def statuses(self) -> list[str]:
        return [line[len("STATUS="):] for m in self.messages for line in m.split("\n") if line.startswith("STATUS=")]


@pytest.fixture()
def sink(socket_dir: str) -> Iterator[NotifySink]:
    os.makedirs(f"{socket_dir}/systemd")  # the kubelet wipes sockets in its own directory
    receiver = NotifySink(f"{socket_dir}/systemd/notify")
    yield receiver
    receiver.sock.close()


def one_gpu_daemon(socket_dir: str, environ: dict[str, str]) -> Daemon:
    settings = Settings(kubelet_socket=f"{socket_dir}/kubelet.sock", device_discovery_strategy="simulated",
                               simulated_gpus=1)
    return Daemon(settings, SimulatedBackend(1).discover(), None, environ=environ)


def test_ready_comes_before_any_kubelet_then_registration_shows_in_the_status(socket_dir: str,
                                                                            sink: NotifySink) -> None:
    environ = {"NOTIFY_SOCKET": sink.path, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())}
    kubelet = KubeletDouble(socket_dir)
    try:
        with RunningDaemon(one_gpu_daemon(socket_dir, environ)):
            first = sink.until(lambda m: True)
            waiting = f"READY=1\nSTATUS=serving; waiting for the kubelet at {socket_dir}/kubelet.sock"
            assert first == waiting, "READY must not wait for a kubelet that may never come (an agent not yet joined)"
            sink.until(lambda m: m == "WATCHDOG=1")  # fed while waiting
            kubelet.start()
            sink.until(lambda m: m.startswith("STATUS=registered"))
        sink.until(lambda m: m.startswith("STOPPING=1"))
    finally:
        kubelet.stop()
    registered = f"registered 1 devices as nvidia.com/gpu with the kubelet at {socket_dir}/kubelet.sock"
    assert sink.statuses()[-2:] == [registered, "stopping"]
    assert sum(m.startswith("READY=1") for m in sink.messages) == 1


def test_a_refused_registration_is_in_the_status_with_its_retry(socket_dir: str, sink: NotifySink) -> None:
    kubelet = KubeletDouble(socket_dir)
    kubelet.reject_with = grpc.StatusCode.UNAVAILABLE
    kubelet.start()
    try:
        with RunningDaemon(one_gpu_daemon(socket_dir, {"NOTIFY_SOCKET": sink.path})):
            ready = sink.until(lambda m: m.startswith("READY=1"))
            assert "registration with" in ready and "failed (UNAVAILABLE: rejected by test); retrying in" in ready
            kubelet.reject_with = None
            sink.until(lambda m: m.startswith("STATUS=registered"))
    finally:
        kubelet.stop()


def test_healthz_names_what_the_plugin_waits_for(socket_dir: str) -> None:
    from gpu_device_plugin.observability.endpoint import health_status

    daemon = one_gpu_daemon(socket_dir, {})
    waiting = f"serving; waiting for the kubelet at {socket_dir}/kubelet.sock"
    with RunningDaemon(daemon):
        assert wait_until(lambda: daemon.status().state == waiting)
        code, reason = health_status(daemon.status())
    assert (code, reason) == (503, f"unhealthy: not registered with the kubelet; {waiting}")
