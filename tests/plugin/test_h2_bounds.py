"""Memory per connection and per stream stays bounded whatever the peer does, and every way a
ListAndWatch stream ends frees its slot. The real servicer and device state, raw peers
(tests/plugin/h2_peer.py); memory is what the server retains (its buffers, and what
tracemalloc counts across 10,000 health changes), not RSS or timing.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_device_plugin.api import grpc_server
from gpu_device_plugin.config.settings import Settings, TimeSlicing
from gpu_device_plugin.core import policy
from gpu_device_plugin.core.state import DeviceState
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.model import HEALTHY, Health
from gpu_device_plugin.service.server import PluginServer
from gpu_device_plugin.service.servicer import DevicePluginServicer
from h2_peer import (
    ACK,
    DATA,
    END_STREAM,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    LIST_AND_WATCH,
    PING,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    Peer,
    frame,
    grpc_message,
    ping,
    request_fields,
    rst_stream,
    settings,
    window_update,
)
from h2_toy import allocate_request, decode_messages
from helpers import wait_until

SICK = Health(False, "test")


class Plugin:
    """The plugin's server and servicer on `gpus` simulated GPUs with `replicas` each."""

    def __init__(self, socket_dir: str, gpus: int = 64, replicas: int = 1) -> None:
        settings = Settings(device_discovery_strategy="simulated", simulated_gpus=gpus,
                            time_slicing=TimeSlicing(replicas))
        self.settings = settings
        self.state = DeviceState()
        self.state.set_devices(policy.advertised_devices(SimulatedBackend(gpus).discover(), settings))
        self.servicer = DevicePluginServicer(self.state, lambda: settings)
        self.path = f"{socket_dir}/plugin.sock"
        self.server = PluginServer(self.path, self.servicer)
        self.server.start()

    @property
    def connections(self) -> list[Any]:
        assert self.server._server is not None
        return list(self.server._server._connections.values())

    def retained(self) -> int:
        """Bytes the server holds for its peers: buffers, unsent messages, unsent snapshots."""
        total = 0
        for connection in self.connections:
            total += len(connection.out) + len(connection.inbuf)
            for stream in connection.streams.values():
                total += len(stream.pending) + len(stream.call.body)
                if stream.call.queued is not None:
                    total += len(stream.call.queued.SerializeToString())
        return total

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture()
def plugin(socket_dir: str) -> Iterator[Plugin]:
    running = Plugin(socket_dir)
    yield running
    running.stop()


def open_watch(peer: Peer, stream: int = 1) -> None:
    peer.send(peer.headers(stream, request_fields(LIST_AND_WATCH)), frame(DATA, END_STREAM, stream, grpc_message(b"")))


class Kubelet:
    """A well-behaved ListAndWatch reader in a thread: keeps the newest device list it got."""

    def __init__(self, path: str) -> None:
        self.peer = Peer(path)
        self.peer.handshake()
        open_watch(self.peer)
        self.latest: dict[str, str] = {}
        self.messages = 0
        self.cond = threading.Condition()
        self._data = bytearray()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for got in self.peer.frames(wait=60):
            if got.kind == DATA and got.stream == 1:
                if got.payload:  # as a client does: the window back for what it read
                    self.peer.send(window_update(0, len(got.payload)), window_update(1, len(got.payload)))
                self._data += got.payload
                # whole messages only: each is 5 bytes of prefix and its length
                while len(self._data) >= 5 and len(self._data) >= 5 + int.from_bytes(self._data[1:5], "big"):
                    size = 5 + int.from_bytes(self._data[1:5], "big")
                    (message,) = decode_messages(bytes(self._data[:size]))
                    del self._data[:size]
                    with self.cond:
                        self.latest = {d.ID: d.health for d in message.devices}
                        self.messages += 1
                        self.cond.notify_all()
            elif got.kind == PING and not got.flags & ACK:
                self.peer.send(ping(got.payload, ack=True))
            elif got.kind in (RST_STREAM, HEADERS) and got.stream == 1 and got.flags & END_STREAM:
                return

    def wait_for(self, device: str, health: str, timeout: float = 30) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.latest.get(device) == health, timeout)

    def close(self) -> None:
        self.peer.close()


def flip(state: DeviceState, times: int) -> None:
    for i in range(times):
        state.report_health("sim-gpu-0", SICK if i % 2 == 0 else HEALTHY)


def traced_growth(body) -> int:
    """Bytes still allocated after `body()` ran that were not before it (every thread counted)."""
    gc.collect()
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        body()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_a_zero_window_reader_holds_at_most_its_newest_snapshot_through_10000_changes(plugin: Plugin) -> None:
    kubelet = Kubelet(plugin.path)
    stalled = Peer(plugin.path, {INITIAL_WINDOW_SIZE: 0})  # and never a WINDOW_UPDATE
    stalled.handshake()
    open_watch(stalled)
    assert wait_until(lambda: plugin.servicer.streams == 2, 5)
    snapshot = len(grpc_message(b"x" * 64 * 40))  # an upper bound for 64 devices' list
    flip(plugin.state, 100)  # the stream's first message is stuck in its window

    def changes() -> None:
        flip(plugin.state, 10_000)
        plugin.state.report_health("sim-gpu-5", SICK)  # the newest state: one no earlier list had
        assert kubelet.wait_for("sim-gpu-5", "Unhealthy"), "the kubelet's stream must get the newest state"

    growth = traced_growth(changes)
    # before this branch every change appended a full list to the stream's queue: ~20 MB here
    assert growth < 256 * 1024, f"the server kept {growth} bytes more after 10,000 changes"
    assert plugin.retained() <= 3 * snapshot, f"{plugin.retained()} bytes held for a stalled reader"
    # once the reader opens its window it gets the list it was sent first, then the newest: nothing between
    stalled.send(window_update(0, 1 << 20), window_update(1, 1 << 20))
    data = b"".join(f.payload for f in stalled.frames(wait=0.5) if f.kind == DATA and f.stream == 1)
    lists = [{d.ID: d.health for d in m.devices} for m in decode_messages(data)]
    assert len(lists) == 2 and lists[-1]["sim-gpu-5"] == "Unhealthy"
    kubelet.close()
    stalled.close()


def test_a_client_that_grants_a_huge_window_and_never_reads_fills_only_the_output_cap(socket_dir: str) -> None:
    plugin = Plugin(socket_dir, gpus=64, replicas=16)  # 1,024 devices: ~40 kB a list
    try:
        kubelet = Kubelet(plugin.path)
        wedged = Peer(plugin.path, {INITIAL_WINDOW_SIZE: 0x7FFFFFFF})
        wedged.handshake()
        wedged.send(window_update(0, 0x7FFFFFFF - 65535))
        open_watch(wedged)
        assert wait_until(lambda: plugin.servicer.streams == 2, 5)
        largest = len(plugin.connections[0].out) + 64 * 16 * 60  # an upper bound for one list

        def changes() -> None:
            for i in range(400):
                seen = kubelet.messages
                plugin.state.report_health("sim-gpu-0", SICK if i % 2 == 0 else HEALTHY)
                if i % 5 == 0:  # paced: lists really go out to both streams (~3 MB for the wedged one)
                    with kubelet.cond:
                        kubelet.cond.wait_for(lambda: kubelet.messages > seen, 10)  # noqa: B023
            plugin.state.report_health("sim-gpu-5", SICK)
            assert kubelet.wait_for("sim-gpu-5::0", "Unhealthy")

        growth = traced_growth(changes)
        blocked = [c for c in plugin.connections if c.interest & grpc_server._WRITE]
        assert blocked, "the wedged connection must have output waiting (the test did not stress it)"
        out_limit = grpc_server.DEFAULT.out_limit
        assert all(len(c.out) <= out_limit + largest for c in plugin.connections)
        assert plugin.retained() <= out_limit + 4 * largest
        # the output cap, one list in flight and one queued (as objects: ~10x their wire size), buffers'
        # spare capacity; before this branch every list sent went into the output buffer: ~16 MB here
        assert growth < 2 * 1024 * 1024, f"{growth} bytes kept after 400 changes"
        kubelet.close()
        wedged.close()
    finally:
        plugin.stop()


def flood(peer: Peer, frame_bytes: bytes, paused, most: int = 200_000) -> int:
    """Send `frame_bytes` until the server stops taking them because it stopped reading (`paused()`
    says so: a condition, not a guess from how long sends block) or `most` went out; never reads.
    How many went out whole."""
    peer.sock.setblocking(False)
    batch = frame_bytes * 256
    sent = 0
    pending = b""
    deadline = time.monotonic() + 60
    while sent < most * len(frame_bytes) and time.monotonic() < deadline:
        chunk = pending or batch
        try:
            n = peer.sock.send(chunk)
        except BlockingIOError:
            if paused():
                break
            threading.Event().wait(0.01)  # the server's side is full: give its loop a moment
            continue
        sent += n
        pending = chunk[n:]
    peer.sock.settimeout(5)
    if pending:  # finish the frame cut in half
        peer.sock.sendall(pending[:len(pending) % len(frame_bytes)])
        sent += len(pending) % len(frame_bytes)
    return sent // len(frame_bytes)


@pytest.mark.parametrize(("name", "frame_bytes", "answer"), [
    ("PING", ping(b"flooding"), PING),
    ("SETTINGS", settings({INITIAL_WINDOW_SIZE: 65535}), SETTINGS),
], ids=["PING", "SETTINGS"])
def test_a_flood_from_a_client_that_never_reads_pauses_its_connection_and_loses_nothing(
        plugin: Plugin, name: str, frame_bytes: bytes, answer: int) -> None:
    kubelet = Kubelet(plugin.path)
    flooder = Peer(plugin.path)
    flooder.handshake()
    sent = 0

    def send() -> None:
        nonlocal sent
        sent = flood(flooder, frame_bytes, lambda: any(c.blocked() for c in plugin.connections))

    growth = traced_growth(send)
    connection = next(c for c in plugin.connections if c.blocked())
    out_limit = grpc_server.DEFAULT.out_limit
    assert len(connection.out) < out_limit + len(frame_bytes)
    assert len(connection.inbuf) <= 64 * 1024 + 16 * 1024
    assert growth < 2 * out_limit, f"{name} flood: {growth} bytes kept"
    assert sent > 10_000, f"only {sent} {name} frames went out before the server stopped reading"
    # the rest of the plugin is unaffected: the kubelet's stream and calls go on
    plugin.state.report_health("sim-gpu-3", SICK)
    assert kubelet.wait_for("sim-gpu-3", "Unhealthy", 10)
    kubelet.peer.send(kubelet.peer.call(3, allocate_request("sim-gpu-1")))  # answered on its own connection
    # once the flooder reads, every frame it sent is answered: the server paused, it dropped nothing
    answered = 0
    for got in flooder.frames(wait=5):
        if got.kind == answer and got.flags & ACK:
            answered += 1
            if answered == sent:
                break
    assert answered == sent
    assert flooder.alive()
    kubelet.close()
    flooder.close()


# ------------------------------------------------------------------ every end of a stream frees its slot

def second_headers(peer: Peer) -> None:
    peer.send(peer.headers(1, [(b"x-trailer", b"1")], end_stream=True))


def data_after_end(peer: Peer) -> None:
    peer.send(frame(DATA, 0, 1, b"more"))


def reset_by_client(peer: Peer) -> None:
    peer.send(rst_stream(1, 8))


def connection_lost(peer: Peer) -> None:
    peer.sock.shutdown(socket.SHUT_RDWR)


def connection_error(peer: Peer) -> None:
    peer.send(window_update(0, 0))


@pytest.mark.parametrize("end", [second_headers, data_after_end, reset_by_client, connection_lost, connection_error])
def test_every_way_a_watch_ends_frees_its_slot(plugin: Plugin, end) -> None:
    peers = []
    for _ in range(2):  # the servicer's cap: the kubelet's stream and one more
        peer = Peer(plugin.path)
        peer.handshake()
        open_watch(peer)
        peers.append(peer)
    assert wait_until(lambda: plugin.servicer.streams == 2, 5)
    refused = Peer(plugin.path)
    refused.handshake()
    open_watch(refused)  # a third is refused: no slot taken for it
    fields, _, _ = refused.response(1)
    assert fields[b"grpc-status"] == b"8"
    assert plugin.servicer.streams == 2
    end(peers[0])
    assert wait_until(lambda: plugin.servicer.streams == 1, 5), f"{end.__name__} left the slot taken"
    again = Peer(plugin.path)
    again.handshake()
    open_watch(again)
    again.until(lambda f: f.kind == DATA and f.stream == 1)  # admitted: a device list, not an error
    for peer in (*peers, refused, again):
        peer.close()


def test_shutdown_ends_a_stalled_watch_and_frees_its_slot(socket_dir: str) -> None:
    plugin = Plugin(socket_dir)
    stalled = Peer(plugin.path, {INITIAL_WINDOW_SIZE: 0})
    stalled.handshake()
    open_watch(stalled)
    assert wait_until(lambda: plugin.servicer.streams == 1, 5)
    plugin.stop()
    assert plugin.servicer.streams == 0
    stalled.close()


def test_a_second_headers_on_an_open_watch_is_stream_closed(plugin: Plugin) -> None:
    peer = Peer(plugin.path)
    peer.handshake()
    open_watch(peer)
    peer.until(lambda f: f.kind == DATA and f.stream == 1)
    second_headers(peer)
    reset = peer.until(lambda f: f.kind == RST_STREAM and f.stream == 1)[-1]
    assert reset.error_code == STREAM_CLOSED
    plugin.state.report_health("sim-gpu-0", SICK)
    assert peer.alive()
    assert not [f for f in peer.frames(wait=0.3) if f.stream == 1], "no DATA on the reset stream"
    peer.close()
