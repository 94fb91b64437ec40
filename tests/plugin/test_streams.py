"""ListAndWatch streams hold a gRPC worker each: extra ones must never starve the unary calls."""

from __future__ import annotations

import threading

import grpc
import pytest
from gpu_device_plugin.api import pb, rpc
from helpers import FEATURES_OFF, run_simulated, wait_until
from kubelet_double import KubeletDouble

EXTRA_STREAMS = 6


class Watcher:
    """A client holding one ListAndWatch stream open, as a debugging tool or a fuzzer would."""

    def __init__(self, socket_path: str) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket_path}")
        self.stream = rpc.Stub(self.channel, "DevicePlugin").ListAndWatch(pb.Empty())
        self.code: grpc.StatusCode | None = None
        self.first = threading.Event()
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for _ in self.stream:
                self.first.set()
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.code = exc.code()
        finally:
            self.ended.set()

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


@pytest.fixture()
def watchers():
    opened: list[Watcher] = []
    yield opened
    for watcher in opened:
        watcher.close()


def test_extra_streams_leave_allocate_and_the_self_probe_a_worker(socket_dir: str, kubelet: KubeletDouble,
                                                                  watchers: list[Watcher]) -> None:
    with run_simulated(socket_dir) as daemon:
        endpoint = kubelet.wait_registered()
        endpoint.wait_for(lambda d: len(d) == 2)
        watchers.extend(Watcher(daemon.socket_path) for _ in range(EXTRA_STREAMS))
        assert wait_until(lambda: all(w.first.is_set() or w.ended.is_set() for w in watchers), 5)
        # deadlines, not timings: with every worker held by a stream these calls never get an answer
        response = endpoint.allocate(["sim-gpu-0"])
        assert dict(response.container_responses[0].envs) == {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": "sim-gpu-0"}
        daemon.self_probe_timeout = 3.0
        assert daemon.alive(), "the watchdog's self-probe must get a worker too"
        refused = [w for w in watchers if w.ended.is_set()]
        assert refused and all(w.code == grpc.StatusCode.RESOURCE_EXHAUSTED for w in refused)
        assert not endpoint.stream_ended.is_set(), "the kubelet's own stream must survive the extra ones"
        assert endpoint.wait_for(lambda d: len(d) == 2)


def test_the_stream_of_a_new_registration_replaces_streams_opened_before_it(
        socket_dir: str, kubelet: KubeletDouble, watchers: list[Watcher]) -> None:
    from gpu_device_plugin.service.servicer import MAX_STREAMS

    with run_simulated(socket_dir) as daemon:
        first = kubelet.wait_registered()
        first.wait_for(lambda d: len(d) == 2)
        watchers.extend(Watcher(daemon.socket_path) for _ in range(MAX_STREAMS))
        assert wait_until(lambda: all(w.first.is_set() or w.ended.is_set() for w in watchers), 5)
        # the kubelet's stream fills the cap with the watchers; a re-registration must still get in
        daemon.session.try_register()
        second = kubelet.wait_registered(count=2)
        assert second.wait_for(lambda d: len(d) == 2)
        assert wait_until(lambda: all(w.ended.is_set() for w in watchers), 5), "older streams were kept"
        assert not second.stream_ended.is_set()
