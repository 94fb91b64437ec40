"""The plugin's own gRPC server and client, against grpcio and against raw HTTP/2 frames.

grpcio (C-core) as the client proves interoperability; raw frames reach what no well-behaved
client sends: tiny flow-control windows, CONTINUATION, compressed messages, broken prefaces.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from gpu_device_plugin.api import grpc_client, h2, pb
from gpu_device_plugin.api.grpc_server import CallContext, Method, Server
from gpu_device_plugin.api.status import RpcFailure, StatusCode
from helpers import wait_until

UNARY = "/v1beta1.DevicePlugin/Allocate"
WATCH = "/v1beta1.DevicePlugin/ListAndWatch"


class ListWatch:
    """A Watch sending the current list whenever `version` moves; over once `done` is set."""

    def __init__(self, owner: Toy) -> None:
        self.owner = owner
        self.seen = -1
        self.closed = threading.Event()

    def poll(self) -> tuple[list[Any], bool]:
        if self.owner.done:
            return [], True
        if self.seen == self.owner.version:
            return [], False
        self.seen = self.owner.version
        response = pb.ListAndWatchResponse()
        for i in range(self.owner.devices):
            response.devices.add(ID=f"gpu-{i:04d}", health=pb.HEALTHY)
        return [response], False

    def close(self) -> None:
        self.closed.set()


class Toy:
    def __init__(self) -> None:
        self.version = 0
        self.devices = 2
        self.done = False
        self.watches: list[ListWatch] = []

    def allocate(self, request: Any, context: CallContext) -> Any:
        ids = [i for c in request.container_requests for i in c.devices_ids]
        if "bad" in ids:
            context.abort(StatusCode.INVALID_ARGUMENT, "unknown device «bad» (100% sure)")
        if "crash" in ids:
            raise ValueError("boom")
        response = pb.AllocateResponse()
        response.container_responses.add().envs["IDS"] = ",".join(ids)
        return response

    def watch(self, request: Any, context: CallContext) -> ListWatch:
        watch = ListWatch(self)
        self.watches.append(watch)
        return watch


@pytest.fixture()
def served(socket_dir: str) -> Iterator[tuple[Server, Toy, str]]:
    toy = Toy()
    path = f"{socket_dir}/toy.sock"
    server = Server({UNARY: Method(pb.AllocateRequest, toy.allocate, False),
                     WATCH: Method(pb.Empty, toy.watch, True)})
    server.bind(path)
    server.start()
    yield server, toy, path
    server.stop()


def allocate_request(*ids: str) -> Any:
    request = pb.AllocateRequest()
    request.container_requests.add(devices_ids=list(ids))
    return request


# ------------------------------------------------------------------ through grpcio

def test_grpcio_unary_calls_get_answers_and_statuses(served: tuple[Server, Toy, str]) -> None:
    _, _, path = served
    with grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_unary(UNARY, request_serializer=pb.AllocateRequest.SerializeToString,
                                   response_deserializer=pb.AllocateResponse.FromString)
        for _ in range(3):  # the same connection: HPACK's dynamic table in use from the second call
            assert dict(call(allocate_request("a", "b"), timeout=5).container_responses[0].envs) == {"IDS": "a,b"}
        with pytest.raises(grpc.RpcError) as refused:
            call(allocate_request("bad"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == "unknown device «bad» (100% sure)"
        with pytest.raises(grpc.RpcError) as crashed:
            call(allocate_request("crash"), timeout=5)
        assert crashed.value.code() == grpc.StatusCode.UNKNOWN and "boom" in crashed.value.details()
        with pytest.raises(grpc.RpcError) as unknown:
            channel.unary_unary("/v1beta1.DevicePlugin/Nope")(b"", timeout=5)
        assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as corrupt:
            channel.unary_unary(UNARY)(b"\xff\xff\xff\x01", timeout=5)
        assert corrupt.value.code() == grpc.StatusCode.INTERNAL
        with pytest.raises(grpc.RpcError) as huge:
            channel.unary_unary(UNARY)(b"\x0a" * (4 * 1024 * 1024 + 10), timeout=10)
        assert huge.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert call(allocate_request("after"), timeout=5).container_responses[0].envs["IDS"] == "after"


def test_a_stream_sends_each_change_after_wake_and_ends_ok(served: tuple[Server, Toy, str]) -> None:
    server, toy, path = served
    with grpc.insecure_channel(f"unix:{path}") as channel:
        stream = channel.unary_stream(WATCH, request_serializer=pb.Empty.SerializeToString,
                                      response_deserializer=pb.ListAndWatchResponse.FromString)(pb.Empty())
        assert len(next(stream).devices) == 2
        toy.devices, toy.version = 3, 1
        server.wake()
        assert len(next(stream).devices) == 3
        toy.devices, toy.version = 4000, 2  # ~60 kB: more than one frame, near the default window
        server.wake()
        assert len(next(stream).devices) == 4000
        toy.done = True
        server.wake()
        assert list(stream) == []  # ended with status OK: no error raised
        assert toy.watches[0].closed.wait(5)


def test_a_cancelled_stream_is_closed_and_others_go_on(served: tuple[Server, Toy, str]) -> None:
    server, toy, path = served
    with grpc.insecure_channel(f"unix:{path}") as channel:
        method = channel.unary_stream(WATCH, response_deserializer=pb.ListAndWatchResponse.FromString)
        first, second = method(b""), method(b"")
        next(first), next(second)
        first.cancel()  # which watch is whose depends on which call's HEADERS arrived first
        assert wait_until(lambda: any(w.closed.is_set() for w in toy.watches), 5)
        assert sum(w.closed.is_set() for w in toy.watches) == 1
        toy.version = 1
        server.wake()
        assert len(next(second).devices) == 2


def test_stop_ends_open_streams_and_the_listener(socket_dir: str) -> None:
    toy = Toy()
    path = f"{socket_dir}/stop.sock"
    server = Server({WATCH: Method(pb.Empty, toy.watch, True)})
    server.bind(path)
    server.start()
    channel = grpc.insecure_channel(f"unix:{path}")
    stream = channel.unary_stream(WATCH, response_deserializer=pb.ListAndWatchResponse.FromString)(b"")
    next(stream)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2
    assert server.stopped.is_set() and toy.watches[0].closed.is_set()
    with pytest.raises(grpc.RpcError) as ended:
        next(stream)
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()
    probe = socket.socket(socket.AF_UNIX)
    with pytest.raises(OSError):
        probe.connect(path)
    probe.close()


# ------------------------------------------------------------------ raw HTTP/2

class Raw:
    def __init__(self, path: str, settings: dict[int, int] | None = None, preface: bytes = h2.PREFACE) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.sock.settimeout(5)
        self.buf = bytearray()
        self.sock.sendall(preface + h2.settings(settings or {}))

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def frames(self, wait: float = 5.0) -> Iterator[tuple[int, int, int, bytes]]:
        """Frames as they come, until nothing arrives for `wait` seconds or the peer closes."""
        self.sock.settimeout(wait)
        while True:
            while len(self.buf) >= 9:
                length, kind, flags, stream = h2.parse_header(self.buf)
                if len(self.buf) < 9 + length:
                    break
                payload = bytes(self.buf[9:9 + length])
                del self.buf[:9 + length]
                yield kind, flags, stream, payload
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return
            if not data:
                return
            self.buf += data

    def call_headers(self, stream: int, path: str, end_stream: bool = False) -> bytes:
        block = h2.header_block([(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
                              (b"content-type", b"application/grpc"), (b"te", b"trailers")])
        return h2.frame(h2.HEADERS, h2.END_HEADERS | (h2.END_STREAM if end_stream else 0), stream, block)

    def close(self) -> None:
        self.sock.close()


def trailers(frames: list[tuple[int, int, int, bytes]], stream: int) -> dict[bytes, bytes]:
    decoder = h2.HeaderDecoder()
    fields: dict[bytes, bytes] = {}
    for kind, _, number, payload in frames:
        if kind == h2.HEADERS and number == stream:
            fields.update(decoder.decode(payload))
    return fields


def test_a_tiny_window_holds_data_back_until_the_client_opens_it(served: tuple[Server, Toy, str]) -> None:
    _, toy, path = served
    toy.devices = 50  # about 1 kB
    raw = Raw(path, {h2.INITIAL_WINDOW_SIZE: 100})
    raw.send(raw.call_headers(1, WATCH), h2.frame(h2.DATA, h2.END_STREAM, 1, h2.grpc_message(b"")))
    first = list(raw.frames(wait=0.5))
    data = b"".join(p for kind, _, s, p in first if kind == h2.DATA and s == 1)
    assert len(data) == 100, "no more than the stream's window"
    raw.send(h2.window_update(1, 1 << 20))
    rest = list(raw.frames(wait=0.5))
    data += b"".join(p for kind, _, s, p in rest if kind == h2.DATA and s == 1)
    _, length = struct.unpack_from(">BI", data)
    assert len(pb.ListAndWatchResponse.FromString(data[5:5 + length]).devices) == 50
    raw.close()


def test_ping_is_answered_and_continuation_frames_make_one_request(served: tuple[Server, Toy, str]) -> None:
    _, _, path = served
    raw = Raw(path)
    block = h2.header_block([(b":method", b"POST"), (b":scheme", b"http"), (b":path", UNARY.encode()),
                          (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    body = h2.grpc_message(allocate_request("c").SerializeToString())
    raw.send(h2.frame(h2.PING, 0, 0, b"12345678"),
             h2.frame(h2.HEADERS, 0, 1, block[:5]), h2.frame(h2.CONTINUATION, 0, 1, block[5:12]),
             h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, block[12:]),
             h2.frame(h2.DATA, h2.END_STREAM, 1, body))
    got = list(raw.frames(wait=0.5))
    assert (h2.PING, h2.ACK, 0, b"12345678") in got
    assert trailers(got, 1)[b"grpc-status"] == b"0"
    data = b"".join(p for kind, _, s, p in got if kind == h2.DATA and s == 1)
    assert pb.AllocateResponse.FromString(data[5:]).container_responses[0].envs["IDS"] == "c"
    raw.close()


@pytest.mark.parametrize(("encoding", "code"), [
    (None, StatusCode.INTERNAL),  # gRPC: without grpc-encoding the compressed flag must be 0
    (b"identity", StatusCode.INTERNAL),
    (b"gzip", StatusCode.UNIMPLEMENTED),  # an encoding we do not decode
])
def test_a_compressed_message_is_refused_and_the_connection_goes_on(served: tuple[Server, Toy, str],
                                                                     encoding: bytes | None,
                                                                     code: StatusCode) -> None:
    _, _, path = served
    raw = Raw(path)
    message = allocate_request("z").SerializeToString()
    extra = [(b"grpc-encoding", encoding)] if encoding else []
    block = h2.header_block([(b":method", b"POST"), (b":scheme", b"http"), (b":path", UNARY.encode()),
                             (b"content-type", b"application/grpc"), (b"te", b"trailers"), *extra])
    raw.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, block),
             h2.frame(h2.DATA, h2.END_STREAM, 1, struct.pack(">BI", 1, len(message)) + message),
             raw.call_headers(3, UNARY), h2.frame(h2.DATA, h2.END_STREAM, 3, h2.grpc_message(message)))
    got = list(raw.frames(wait=0.5))
    assert trailers(got, 1)[b"grpc-status"] == str(int(code)).encode()
    assert trailers(got, 3)[b"grpc-status"] == b"0"
    raw.close()


@pytest.mark.parametrize("preface", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"])
def test_a_client_that_is_not_http2_is_disconnected(served: tuple[Server, Toy, str], preface: bytes) -> None:
    _, _, path = served
    raw = Raw(path, preface=preface)
    got = list(raw.frames(wait=2))
    assert got and got[-1][0] == h2.GOAWAY, "GOAWAY, then the server closes"
    raw.close()


def test_a_broken_header_block_ends_the_connection_with_compression_error(served: tuple[Server, Toy, str]) -> None:
    _, _, path = served
    raw = Raw(path)
    raw.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\xbe"))  # dynamic index 62 of an empty table
    goaway = [p for kind, _, _, p in raw.frames(wait=2) if kind == h2.GOAWAY]
    assert goaway and struct.unpack_from(">II", goaway[0])[1] == h2.COMPRESSION_ERROR
    raw.close()


# ------------------------------------------------------------------ the client

def test_the_client_gets_answers_and_statuses(served: tuple[Server, Toy, str]) -> None:
    _, _, path = served
    answer = grpc_client.call(path, UNARY, allocate_request("x").SerializeToString(), 5)
    assert pb.AllocateResponse.FromString(answer).container_responses[0].envs["IDS"] == "x"
    with pytest.raises(RpcFailure) as refused:
        grpc_client.call(path, UNARY, allocate_request("bad").SerializeToString(), 5)
    assert refused.value.code == StatusCode.INVALID_ARGUMENT
    assert refused.value.details == "unknown device «bad» (100% sure)"


def test_the_client_says_unavailable_or_deadline_exceeded(socket_dir: str) -> None:
    with pytest.raises(RpcFailure) as nobody:
        grpc_client.call(f"{socket_dir}/absent.sock", UNARY, b"", 1)
    assert nobody.value.code == StatusCode.UNAVAILABLE
    silent = socket.socket(socket.AF_UNIX)  # listens, never answers: a wedged server
    silent.bind(f"{socket_dir}/silent.sock")
    silent.listen(1)
    started = time.monotonic()
    with pytest.raises(RpcFailure) as late:
        grpc_client.call(f"{socket_dir}/silent.sock", UNARY, b"", 0.3)
    assert late.value.code == StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 2
    silent.close()


def test_the_client_talks_to_a_grpcio_server(socket_dir: str) -> None:
    from concurrent import futures

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        if request == b"no":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not now – später, 100%")
        return request[::-1]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.T", {"Echo": grpc.unary_unary_rpc_method_handler(handler)}),))
    server.add_insecure_port(f"unix:{socket_dir}/g.sock")
    server.start()
    try:
        assert grpc_client.call(f"{socket_dir}/g.sock", "/t.T/Echo", b"abc", 5) == b"cba"
        with pytest.raises(RpcFailure) as refused:
            grpc_client.call(f"{socket_dir}/g.sock", "/t.T/Echo", b"no", 5)
        assert (refused.value.code, refused.value.details) == (StatusCode.FAILED_PRECONDITION,
                                                               "not now – später, 100%")
    finally:
        server.stop(None)
