"""A frame-level fuzz run of the gRPC server (hypothesis, a fixed number of examples, derandomized
so CI runs the same ones every time): sequences of frames of every type, with flags, stream
ids and payloads both valid and arbitrary, and real or random header blocks. After each, the
server must still answer a PING on that connection or have ended it with GOAWAY, never have
sent a frame on a stream it had ended nor a RST_STREAM for a stream the client never opened,
send only well-formed frames, and answer an Allocate on a fresh connection.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import hpack
import pytest
from h2_peer import (
    ACK,
    ALLOCATE,
    DATA,
    END_STREAM,
    GOAWAY,
    HEADERS,
    LIST_AND_WATCH,
    PING,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Frame,
    Peer,
    frame,
    grpc_message,
    ping,
    request_fields,
)
from h2_toy import allocate_request, serving
from helpers import short_tempdir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = 400  # a fixed budget: ~10 s on this 2-core machine
STREAMS = st.sampled_from([0, 1, 1, 1, 3, 3, 5, 2, 4, 0x7FFFFFFF])
PATHS = st.sampled_from([ALLOCATE, LIST_AND_WATCH, "/v1beta1.DevicePlugin/Nope", "/", ""])
FIELDS = st.lists(st.tuples(st.sampled_from([b"x-a", b"te", b"content-type", b":path", b":status", b"Upper",
                                             b"content-length", b"grpc-encoding", b"connection", b"host"]),
                            st.sampled_from([b"", b"1", b"trailers", b"gzip", b"application/grpc", b" x", b"a\nb",
                                             b"\x00"])), max_size=3)


@st.composite
def header_blocks(draw) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=40))  # arbitrary bytes: often undecodable
    fields = request_fields(draw(PATHS), draw(st.sampled_from([b"POST", b"GET", b"CONNECT"])))
    if kind == 2:
        fields = [*fields, *draw(FIELDS)]
    elif kind == 3:
        fields = draw(st.permutations(fields))[: draw(st.integers(1, len(fields)))]
    return hpack.Encoder().encode(fields)


@st.composite
def payloads(draw, kind: int) -> bytes:
    if draw(st.integers(0, 3)) == 0:
        return draw(st.binary(max_size=64))
    if kind == HEADERS:
        return draw(header_blocks())
    if kind == DATA:
        return grpc_message(allocate_request(*draw(st.lists(st.sampled_from(["a", "b", "bad"]), max_size=2))),
                            draw(st.sampled_from([0, 0, 1, 2])))
    if kind == SETTINGS:
        pairs = draw(st.lists(st.tuples(st.integers(0, 8), st.sampled_from([0, 1, 2, 16384, 65535, 1 << 24,
                                                                            0x7FFFFFFF, 1 << 31])), max_size=3))
        return b"".join(struct.pack(">HI", key, value) for key, value in pairs)
    if kind in (WINDOW_UPDATE, RST_STREAM):
        return struct.pack(">I", draw(st.sampled_from([0, 1, 8, 1 << 16, 0x7FFFFFFF, 0xFFFFFFFF])))
    if kind == PING:
        return b"fuzzping"
    if kind == GOAWAY:
        return struct.pack(">II", draw(st.integers(0, 9)), draw(st.integers(0, 13)))
    return draw(st.binary(max_size=8))


@st.composite
def random_frame(draw) -> bytes:
    kind = draw(st.integers(0, 11))  # 10 and 11: extension types a server must ignore
    flags = draw(st.sampled_from([0, 0x1, 0x4, 0x5, 0x8, 0x20, 0x25, 0xFF]))
    return frame(kind, flags, draw(STREAMS), draw(payloads(kind)))


@st.composite
def sequences(draw) -> list[bytes]:
    """Mostly what a client might send (calls on increasing streams, window updates, pings,
    settings, resets), with arbitrary frames mixed in: so runs go deep into stream states
    before (if ever) an error ends them."""
    out: list[bytes] = []
    stream = 1
    for _ in range(draw(st.integers(1, 10))):
        step = draw(st.integers(0, 9))
        if step <= 2:  # a call: headers, maybe a message, maybe its end
            end_now = draw(st.booleans()) and step == 0
            out.append(frame(HEADERS, 0x4 | (END_STREAM if end_now else 0), stream, draw(header_blocks())))
            if not end_now and draw(st.booleans()):
                out.append(frame(DATA, draw(st.sampled_from([0, END_STREAM])), stream, draw(payloads(DATA))))
            stream += 2
        elif step == 3:
            out.append(frame(DATA, END_STREAM, max(1, stream - 2), draw(payloads(DATA))))
        elif step == 4:
            out.append(frame(WINDOW_UPDATE, 0, draw(st.sampled_from([0, max(1, stream - 2)])),
                             struct.pack(">I", draw(st.sampled_from([1, 100, 1 << 20])))))
        elif step == 5:
            out.append(frame(RST_STREAM, 0, max(1, stream - 2), struct.pack(">I", 8)))
        elif step == 6:
            out.append(frame(SETTINGS, 0, 0, draw(payloads(SETTINGS))))
        elif step == 7:
            out.append(ping(draw(st.binary(min_size=8, max_size=8))))
        else:
            out.append(draw(random_frame()))
    return out


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[object, object, str]]:
    directory = short_tempdir()
    with serving(directory) as running:
        yield running


def check_server_frames(got: list[Frame], opened: set[int]) -> None:
    answered: set[int] = set()  # we sent END_STREAM: only RST_STREAM NO_ERROR may follow (early answer)
    reset: set[int] = set()  # we sent RST_STREAM: nothing may follow
    decoder = hpack.Decoder()
    for item in got:
        assert len(item.payload) <= 16384, f"a frame above the default maximum: {item}"
        assert item.stream not in reset, f"a frame on stream {item.stream} after its RST_STREAM: {got}"
        if item.stream in answered:
            assert item.kind == RST_STREAM and item.error_code == 0, f"a frame after END_STREAM: {got}"
        if item.kind == RST_STREAM:
            assert len(item.payload) == 4 and item.stream in opened, f"RST_STREAM for a stream never opened: {got}"
            reset.add(item.stream)
        elif item.kind == WINDOW_UPDATE:
            assert len(item.payload) == 4
        elif item.kind == GOAWAY:
            assert item.stream == 0 and len(item.payload) >= 8
        elif item.kind == SETTINGS:
            assert item.stream == 0 and len(item.payload) % 6 == 0
        elif item.kind == HEADERS:
            assert item.stream in opened
            decoder.decode(item.payload)  # our blocks must decode (and keep no state)
        if item.kind in (HEADERS, DATA) and item.flags & END_STREAM:
            answered.add(item.stream)


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(sequence=sequences())
def test_any_sequence_of_frames_leaves_the_server_answering(served: tuple[object, object, str],
                                                            sequence: list[bytes]) -> None:
    server, _, path = served
    peer = Peer(path)
    try:
        peer.send(*sequence, ping(b"lastword"))
        got: list[Frame] = []
        answered = False
        for item in peer.frames(wait=5):
            got.append(item)
            if item.kind == PING and item.flags & ACK and item.payload == b"lastword":
                answered = True
                break
        opened = {struct.unpack_from(">I", f, 5)[0] & 0x7FFFFFFF for f in sequence if f[3] == HEADERS}
        check_server_frames(got, opened)
        if not answered:
            assert any(item.kind == GOAWAY for item in got), f"neither an answer nor GOAWAY: {got}"
    finally:
        peer.close()
    assert server._thread.is_alive(), "the server loop died"
    fresh = Peer(path)
    try:
        fresh.send(fresh.call(1, allocate_request("after")))
        fields, _, _ = fresh.response(1)
        assert fields[b"grpc-status"] == b"0"
    finally:
        fresh.close()


@st.composite
def reset_storms(draw) -> list[bytes]:
    """Calls and watches opened and reset at once, in bursts, with the odd well-formed call between."""
    out: list[bytes] = []
    stream = 1
    for _ in range(draw(st.integers(1, 40))):
        path = draw(st.sampled_from([LIST_AND_WATCH, LIST_AND_WATCH, ALLOCATE]))
        out.append(frame(HEADERS, 0x4, stream, hpack.Encoder().encode(request_fields(path))))
        if draw(st.booleans()):
            out.append(frame(DATA, END_STREAM, stream, grpc_message(b"" if path == LIST_AND_WATCH
                                                                    else allocate_request("a"))))
        if draw(st.integers(0, 3)):
            out.append(frame(RST_STREAM, 0, stream, struct.pack(">I", draw(st.sampled_from([0, 8, 2])))))
        stream += 2
    return out


def run_on(path: str, sequence: list[bytes], results: dict[int, tuple[list[Frame], bool, set[int]]],
           index: int) -> None:
    peer = Peer(path)
    try:
        peer.send(*sequence, ping(b"lastword"))
        got: list[Frame] = []
        answered = False
        for item in peer.frames(wait=5):
            got.append(item)
            if item.kind == PING and item.flags & ACK and item.payload == b"lastword":
                answered = True
                break
        opened = {struct.unpack_from(">I", f, 5)[0] & 0x7FFFFFFF for f in sequence if f[3] == HEADERS}
        results[index] = (got, answered, opened)
    finally:
        peer.close()


@settings(max_examples=EXAMPLES // 4, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(shapes=st.lists(st.one_of(sequences(), reset_storms()), min_size=2, max_size=4))
def test_several_connections_at_once_with_reset_storms_leave_every_one_answered(
        served: tuple[object, object, str], shapes: list[list[bytes]]) -> None:
    """The same checks, with 2-4 connections sending at once (some of them open-and-reset storms):
    one peer's frames never leave another's unanswered."""
    import threading

    server, _, path = served
    results: dict[int, tuple[list[Frame], bool, set[int]]] = {}
    threads = [threading.Thread(target=run_on, args=(path, shape, results, i)) for i, shape in enumerate(shapes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == len(shapes), "a connection's run did not finish"
    for got, answered, opened in results.values():
        check_server_frames(got, opened)
        if not answered:
            assert any(item.kind == GOAWAY for item in got), f"neither an answer nor GOAWAY: {got[-10:]}"
    assert server._thread.is_alive(), "the server loop died"
    fresh = Peer(path)
    try:
        fresh.send(fresh.call(1, allocate_request("after")))
        fields, _, _ = fresh.response(1)
        assert fields[b"grpc-status"] == b"0"
    finally:
        fresh.close()
