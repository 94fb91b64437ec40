"""The transport stays live and bounded whatever its peers do (issue 36): one test per defect
an adversarial review found, each failing on the server before it and passing now. Raw frames
(tests/plugin/h2_peer.py) and grpcio; grpc-go's share is in test_go_client.py. Small `Limits`
where a cap is the point, so a test needs no gigabytes and no long waits.
"""

from __future__ import annotations

import logging
import resource
import socket
import struct
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from gpu_device_plugin.api import pb, wire
from gpu_device_plugin.api.grpc_server import CallContext
from gpu_device_plugin.api.limits import Limits
from gpu_device_plugin.api.status import RpcFailure, StatusCode
from gpu_device_plugin.service import servicer
from h2_peer import (
    ACK,
    ALLOCATE,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    LIST_AND_WATCH,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    Peer,
    closed_by_server,
    frame,
    grpc_message,
    request_fields,
    rst_stream,
    settings,
    window_update,
)
from h2_toy import Toy, allocate_request, decode_messages, serving
from helpers import wait_until


@pytest.fixture()
def served(socket_dir: str) -> Iterator[tuple[Any, Toy, str]]:
    with serving(socket_dir) as running:
        yield running


def peer_of(path: str, values: dict[int, int] | None = None) -> Peer:
    client = Peer(path, values)
    client.handshake()
    return client


def open_watch(peer: Peer, stream: int = 1) -> None:
    peer.send(peer.headers(stream, request_fields(LIST_AND_WATCH)), frame(DATA, END_STREAM, stream, grpc_message(b"")))


def expect_goaway(peer: Peer, code: int) -> None:
    seen = peer.until(lambda f: f.kind == GOAWAY)
    assert seen[-1].error_code == code, f"GOAWAY code {seen[-1].error_code}, wanted {code}: {seen[-12:]}"


# ------------------------------------------------------------------ 1: flow control, not a size limit

def test_concurrent_requests_larger_than_the_connection_window_all_complete_through_grpcio(
        socket_dir: str) -> None:
    """Credit came back only once a request was consumed, so requests sent together that passed the
    connection window between them could wait forever. Two 1.3 MB calls on one grpcio channel (the
    connection window is 1 MiB) now both end. The deadline is a liveness bound, not a timing: grpcio
    shares this process's GIL with the server, so on a loaded machine this takes seconds (at load 28
    the client read nothing for the default 60 s stall limit, which is not what this test is about)."""
    with serving(socket_dir, limits=Limits(stall_timeout=600)) as (_, _, path), \
            grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_unary(ALLOCATE, request_serializer=lambda m: m,
                                   response_deserializer=pb.AllocateResponse.FromString)
        requests = [allocate_request(*(f"c{n}-{i:09d}" for i in range(100_000))) for n in range(2)]
        assert all(len(r) > 1 << 20 for r in requests)
        pending = [call.future(r, timeout=120) for r in requests]
        answers = [p.result() for p in pending]
    assert [len(a.container_responses[0].envs["IDS"]) for a in answers] == [100_000 * 13 - 1] * 2


def test_credit_beyond_the_budget_goes_to_the_oldest_stream_and_a_stream_overrun_is_its_own_error(
        socket_dir: str) -> None:
    # no budget at all: the oldest waiting stream still gets credit, a younger one does not (and
    # sending past its window is that stream's FLOW_CONTROL_ERROR, the connection goes on)
    with serving(socket_dir, limits=Limits(max_buffered=0, stream_window=16384)) as (_, _, path):
        peer = peer_of(path)
        chunk = b"\0" * 8192
        peer.send(peer.headers(1, request_fields()), peer.headers(3, request_fields()),
                  frame(DATA, 0, 1, chunk), frame(DATA, 0, 1, chunk))
        credit = peer.until(lambda f: f.kind == 8 and f.stream == 1)  # WINDOW_UPDATE for the oldest
        assert not [f for f in credit if f.kind == 8 and f.stream == 3]
        peer.send(*(frame(DATA, 0, 3, chunk) for _ in range(3)))  # 24 KiB into a 16 KiB window
        seen = peer.until(lambda f: f.kind in (RST_STREAM, GOAWAY) and f.stream in (3, 0))
        assert seen[-1].kind == RST_STREAM and seen[-1].error_code == FLOW_CONTROL_ERROR
        assert peer.alive()
        peer.close()


# ------------------------------------------------------------------ 2: large answers drain to any window

@pytest.mark.parametrize("window", [1 << 20, (1 << 31) - 1], ids=["1MiB", "2^31-1"])
def test_a_449_kb_device_list_arrives_whole_to_a_client_with_a_large_window(socket_dir: str, window: int) -> None:
    """Output stopped at exactly the 256 KiB output cap until some unrelated event."""
    toy = Toy(devices=18_000)
    with serving(socket_dir, toy) as (_, _, path):
        peer = peer_of(path, {INITIAL_WINDOW_SIZE: window})
        peer.send(window_update(0, window - 65535))
        open_watch(peer)
        data = bytearray()
        for got in peer.frames(wait=5):
            if got.kind == DATA and got.stream == 1:
                data += got.payload
                if len(data) >= 5 and len(data) >= 5 + int.from_bytes(data[1:5], "big"):
                    break
        assert len(data) > 440_000, f"only {len(data)} bytes arrived"
        (message,) = decode_messages(bytes(data))
        assert len(message.devices) == 18_000
        peer.close()


# ------------------------------------------------------------------ 3: resets cost the attacker

def test_open_and_reset_streams_share_one_snapshot_and_a_rapid_reset_client_is_sent_away(socket_dir: str) -> None:
    toy = Toy(devices=300)
    with serving(socket_dir, toy, Limits(resets_burst=100, resets_per_second=1.0)) as (_, _, path):
        attacker = peer_of(path)
        frames = []
        for n in range(150):
            stream = 1 + 2 * n
            frames += [attacker.headers(stream, request_fields(LIST_AND_WATCH)),
                       frame(DATA, END_STREAM, stream, grpc_message(b"")), rst_stream(stream, 8)]
        attacker.send(*frames)
        expect_goaway(attacker, ENHANCE_YOUR_CALM)
        assert toy.built == 1, "one device-state version: one snapshot for every stream"
        kubelet = peer_of(path)
        kubelet.send(kubelet.call(1, allocate_request("k")))
        assert kubelet.response(1)[0][b"grpc-status"] == b"0"
        kubelet.close()
        attacker.close()


def test_the_servicer_builds_one_list_per_device_state_version() -> None:
    from gpu_device_plugin.core.state import DeviceState

    state = DeviceState()
    lists = servicer.ListResponses(state)
    first = lists.newest()
    assert lists.newest()[1] is first[1]
    state.wake()  # a wake without a change: the same answer
    assert lists.newest()[1] is first[1]
    state.set_devices([])
    assert lists.newest()[0] > first[0]


# ------------------------------------------------------------------ 4: unary answers bounded

def test_an_answer_above_the_stated_size_is_refused_with_resource_exhausted(socket_dir: str) -> None:
    with serving(socket_dir, limits=Limits(max_answer=5_000)) as (_, _, path):
        peer = peer_of(path)
        peer.send(peer.call(1, allocate_request(*(f"d{i:08d}" for i in range(1_000)))))
        fields, data, _ = peer.response(1)
        assert fields[b"grpc-status"] == b"8" and b"ask for less" in fields[b"grpc-message"] and not data
        peer.send(peer.call(3, allocate_request("small")))
        assert peer.response(3)[0][b"grpc-status"] == b"0"
        peer.close()


def test_the_servicer_refuses_more_containers_than_the_kubelet_ever_sends_before_building_an_answer() -> None:
    from gpu_device_plugin.config.settings import Settings
    from gpu_device_plugin.core.state import DeviceState

    service = servicer.DevicePluginServicer(DeviceState(), Settings)
    request = wire.AllocateRequest(container_requests=[wire.ContainerAllocateRequest(devices_ids=["x"])
                                                       for _ in range(servicer.MAX_CONTAINERS + 1)])
    with pytest.raises(RpcFailure) as refused:
        service.Allocate(request, CallContext("/Allocate"))
    assert refused.value.code == StatusCode.RESOURCE_EXHAUSTED


# ------------------------------------------------------------------ 5: bounded in total

def test_at_the_connection_cap_the_least_recently_active_connection_that_is_not_the_kubelets_goes(
        socket_dir: str) -> None:
    with serving(socket_dir, limits=Limits(max_connections=3)) as (server, _, path):
        kubelet = peer_of(path)
        open_watch(kubelet)
        kubelet.until(lambda f: f.kind == DATA)
        connection = next(c for c in server._connections.values() if c.streams)
        server.prefer(connection)  # what the servicer's serve_first() does for the kubelet's stream
        others = [peer_of(path) for _ in range(2)]
        assert all(p.alive() for p in others)
        newest = peer_of(path)  # the fourth: the least recently active of the others goes
        assert newest.alive()
        assert closed_by_server(others[0]), "the least recently active connection was not closed"
        assert kubelet.alive() and others[1].alive()
        for p in (kubelet, *others, newest):
            p.close()


def test_streams_past_the_total_are_refused_but_every_connection_may_open_one(socket_dir: str) -> None:
    with serving(socket_dir, limits=Limits(max_streams=2)) as (_, _, path):
        first = peer_of(path)
        open_watch(first, 1)
        open_watch(first, 3)
        first.until(lambda f: f.kind == DATA and f.stream == 3)
        open_watch(first, 5)
        refused = first.until(lambda f: f.kind == RST_STREAM and f.stream == 5)[-1]
        assert refused.error_code == REFUSED_STREAM
        second = peer_of(path)  # a new connection (a restarted kubelet) is still answered
        second.send(second.call(1, allocate_request("k")))
        assert second.response(1)[0][b"grpc-status"] == b"0"
        first.close()
        second.close()


def test_idle_and_stalled_connections_are_closed_after_the_stated_time(socket_dir: str) -> None:
    with serving(socket_dir, limits=Limits(idle_timeout=0.3, stall_timeout=0.3)) as (server, toy, path):
        idle = peer_of(path)
        stalled = peer_of(path, {INITIAL_WINDOW_SIZE: 0})  # its list never fits: the answer waits
        open_watch(stalled)
        assert closed_by_server(idle) and closed_by_server(stalled)
        assert wait_until(lambda: not server._connections, 5)
        assert all(w.closed.is_set() for w in toy.watches)


# ------------------------------------------------------------------ 6: out of file descriptors

def test_out_of_descriptors_accepting_pauses_with_one_log_line_and_resumes(
        socket_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpu_device_plugin.api.grpc_server")
    with serving(socket_dir, limits=Limits(accept_retry=0.2)) as (server, _, path):
        # The client sockets take their descriptors before the limit drops and connect after
        # it, so the server never gets to accept them early, however the threads are scheduled.
        waiting = [socket.socket(socket.AF_UNIX) for _ in range(3)]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        probe = socket.socket()
        lowest_free = probe.fileno()
        probe.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no new descriptor for anyone
        try:
            for sock in waiting:  # connected, not yet accepted: in the listener's queue
                sock.connect(path)
            server.wake()
            assert wait_until(lambda: "cannot accept" in caplog.text, 5)
            threading.Event().wait(0.7)  # three retry periods while still out of descriptors
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert wait_until(lambda: len(server._connections) == 3, 5), "accepting did not resume"
        lines = [r for r in caplog.records if "cannot accept" in r.getMessage()]
        assert len(lines) == 1, f"one line per episode, got {len(lines)}"
        for sock in waiting:
            sock.close()


def test_the_unit_states_a_file_descriptor_limit_above_what_the_server_caps() -> None:
    from gpu_device_plugin.api.limits import DEFAULT
    from test_unit_file import service

    assert int(service()["LimitNOFILE"]) >= 4 * DEFAULT.max_connections


# ------------------------------------------------------------------ 7: stream errors stay stream errors

def test_a_wrong_content_length_on_an_unknown_method_resets_only_that_stream(served: tuple[Any, Toy, str]) -> None:
    """It was answered UNIMPLEMENTED, then the content-length check ended the whole connection."""
    _, _, path = served
    peer = peer_of(path)
    open_watch(peer, 1)
    peer.until(lambda f: f.kind == DATA and f.stream == 1)
    fields = request_fields("/v1beta1.DevicePlugin/Nope", extra=[(b"content-length", b"5")])
    peer.send(peer.headers(3, fields, end_stream=True))
    seen = peer.until(lambda f: f.kind in (RST_STREAM, GOAWAY) and f.stream in (3, 0))
    assert seen[-1].kind == RST_STREAM and seen[-1].error_code == PROTOCOL_ERROR, seen
    assert peer.alive()
    peer.close()


# ------------------------------------------------------------------ 8: the small ones

def test_more_than_eight_empty_continuation_frames_end_the_connection(served: tuple[Any, Toy, str]) -> None:
    _, _, path = served
    fine = peer_of(path)
    block = fine.block(request_fields())
    fine.send(frame(HEADERS, 0, 1, block), *(frame(CONTINUATION, 0, 1, b"") for _ in range(7)),
              frame(CONTINUATION, END_HEADERS, 1, b""), frame(DATA, END_STREAM, 1, grpc_message(allocate_request("a"))))
    assert fine.response(1)[0][b"grpc-status"] == b"0"
    flood = peer_of(path)
    flood.send(frame(HEADERS, 0, 1, flood.block(request_fields())),
               *(frame(CONTINUATION, 0, 1, b"") for _ in range(50)))
    expect_goaway(flood, ENHANCE_YOUR_CALM)
    fine.close()
    flood.close()


def test_application_grpcx_is_not_grpc(served: tuple[Any, Toy, str]) -> None:
    _, _, path = served
    peer = peer_of(path)
    for stream, content_type, status in ((1, b"application/grpcx", b"415"), (3, b"application/grpc+proto", b"200")):
        fields = [(b"content-type", content_type) if f[0] == b"content-type" else f for f in request_fields()]
        peer.send(peer.headers(stream, fields), frame(DATA, END_STREAM, stream, grpc_message(allocate_request("a"))))
        assert peer.response(stream)[0][b":status"] == status
    peer.close()


def test_settings_entries_apply_in_order(served: tuple[Any, Toy, str]) -> None:
    # an invalid value followed by a valid one of the same setting: still an error (a dict kept the last)
    _, _, path = served
    peer = peer_of(path)
    payload = struct.pack(">HIHI", INITIAL_WINDOW_SIZE, 1 << 31, INITIAL_WINDOW_SIZE, 100)
    peer.send(frame(4, 0, 0, payload))
    expect_goaway(peer, FLOW_CONTROL_ERROR)
    peer.close()


def test_padding_that_eats_the_priority_fields_is_a_protocol_error(served: tuple[Any, Toy, str]) -> None:
    _, _, path = served
    peer = peer_of(path)
    block = peer.block(request_fields())
    # a pad length shorter than the frame, longer than what the pad length and priority fields leave:
    # the padding is what is wrong (PROTOCOL_ERROR), not the frame's size (it was FRAME_SIZE_ERROR)
    pad = len(block) + 2
    peer.send(frame(HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, 1, bytes([pad]) + struct.pack(">IB", 0, 15) + block))
    expect_goaway(peer, PROTOCOL_ERROR)
    peer.close()


def test_after_goaway_the_server_keeps_reading_until_the_client_is_done(served: tuple[Any, Toy, str]) -> None:
    """It stopped reading and closed: a client still sending (over TCP through a proxy: h2spec via socat)
    got a reset, and with it could lose our GOAWAY. Now the rest is read and dropped until the client
    closes (or a second passes), so its writes complete and the GOAWAY waits to be read."""
    _, _, path = served
    peer = peer_of(path)
    junk = frame(0x42, 0, 0, b"\0" * 16000) * 64  # ~1 MB more, more than the socket buffers hold
    failures: list[OSError] = []
    sender = threading.Thread(target=_send, args=(peer, settings({INITIAL_WINDOW_SIZE: 1 << 31}) + junk, failures))
    sender.start()
    sender.join(10)
    assert not sender.is_alive() and not failures, f"the client's writes after our GOAWAY failed: {failures}"
    expect_goaway(peer, FLOW_CONTROL_ERROR)
    peer.close()


def _send(peer: Peer, data: bytes, failures: list[OSError]) -> None:
    try:
        peer.sock.sendall(data)
    except OSError as error:
        failures.append(error)


def test_acknowledging_settings_is_not_confused_by_an_ack(served: tuple[Any, Toy, str]) -> None:
    _, _, path = served
    peer = peer_of(path)
    peer.send(frame(4, ACK, 0, b""))
    assert peer.alive()
    peer.close()


def test_two_servers_in_one_process_and_one_server_on_two_sockets(socket_dir: str) -> None:
    """The DRA driver serves its services and the plugin registration service side by side."""
    from gpu_device_plugin.api.grpc_server import Method, Server

    toy = Toy()
    methods = {ALLOCATE: Method(wire.AllocateRequest, toy.allocate, False)}
    one, two = Server(methods), Server(methods)
    one.bind(f"{socket_dir}/a.sock")
    one.bind(f"{socket_dir}/b.sock")
    two.bind(f"{socket_dir}/c.sock")
    one.start()
    two.start()
    try:
        with futures.ThreadPoolExecutor(3) as pool:
            codes = list(pool.map(lambda name: _allocate_status(f"{socket_dir}/{name}.sock"), "abc"))
        assert codes == [b"0"] * 3
    finally:
        one.stop()
        two.stop()
    assert one.stopped.is_set() and two.stopped.is_set()


def _allocate_status(path: str) -> bytes:
    peer = peer_of(path)
    try:
        peer.send(peer.call(1, allocate_request("x")))
        return peer.response(1)[0][b"grpc-status"]
    finally:
        peer.close()
