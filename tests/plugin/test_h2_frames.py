"""RFC 9113 for a server, frame by frame: each illegal frame or stream state gets the error the
RFC names, of the right kind (a connection error: GOAWAY with that code, then close; a
stream error: RST_STREAM on that stream while the connection goes on), and what the RFC
says to ignore is ignored. Raw frames from tests/plugin/h2_peer.py; no network.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import pytest
from gpu_device_plugin.api import wire
from h2_peer import (
    ACK,
    ALLOCATE,
    CONTINUATION,
    DATA,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    LIST_AND_WATCH,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    NO_ERROR,
    PADDED,
    PING,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    Frame,
    Peer,
    closed_by_server,
    frame,
    grpc_message,
    ping,
    priority,
    request_fields,
    rst_stream,
    settings,
    window_update,
)
from h2_toy import Toy, allocate_request, serving


@pytest.fixture()
def served(socket_dir: str) -> Iterator[tuple[object, Toy, str]]:
    with serving(socket_dir) as running:
        yield running


@pytest.fixture()
def peer(served: tuple[object, Toy, str]) -> Iterator[Peer]:
    client = Peer(served[2])
    client.handshake()
    yield client
    client.close()


def open_watch(peer: Peer, stream: int) -> None:
    """A ListAndWatch call, its request complete (half-closed remote): read up to its first message."""
    peer.send(peer.headers(stream, request_fields(LIST_AND_WATCH)), frame(DATA, END_STREAM, stream, grpc_message(b"")))
    peer.until(lambda f: f.kind == DATA and f.stream == stream)


def finish_call(peer: Peer, stream: int) -> None:
    """A complete Allocate call on `stream`: the stream ends closed on both sides."""
    peer.send(peer.call(stream, allocate_request("a")))
    fields, _, _ = peer.response(stream)
    assert fields[b"grpc-status"] == b"0"


def expect_connection_error(peer: Peer, code: int) -> None:
    seen = peer.until(lambda f: f.kind == GOAWAY)
    assert seen[-1].error_code == code, f"GOAWAY code {seen[-1].error_code}, wanted {code}: {seen}"
    assert closed_by_server(peer), "the server must close the connection after GOAWAY"


def expect_stream_error(peer: Peer, stream: int, code: int) -> list[Frame]:
    seen = peer.until(lambda f: f.kind in (RST_STREAM, GOAWAY) and f.stream in (stream, 0))
    assert seen[-1].kind == RST_STREAM, f"a stream error, not a connection error: {seen}"
    assert seen[-1].error_code == code, f"RST_STREAM code {seen[-1].error_code}, wanted {code}"
    assert peer.alive(), "a stream error leaves the connection working"
    return seen


# ------------------------------------------------------------------ connection errors

CONNECTION_ERRORS: list[tuple[str, Callable[[Peer], bytes], int]] = [
    ("DATA on stream 0", lambda p: frame(DATA, 0, 0, b"x"), PROTOCOL_ERROR),
    ("HEADERS on stream 0", lambda p: p.headers(0, request_fields()), PROTOCOL_ERROR),
    ("DATA on an idle stream", lambda p: frame(DATA, END_STREAM, 1, grpc_message(b"")), PROTOCOL_ERROR),
    ("RST_STREAM on stream 0", lambda p: rst_stream(0, 8), PROTOCOL_ERROR),
    ("RST_STREAM on an idle stream", lambda p: rst_stream(3, 8), PROTOCOL_ERROR),
    ("WINDOW_UPDATE on an idle stream", lambda p: window_update(5, 1), PROTOCOL_ERROR),
    ("connection window increment of 0", lambda p: window_update(0, 0), PROTOCOL_ERROR),
    ("connection window past 2^31-1", lambda p: window_update(0, 0x7FFFFFFF), FLOW_CONTROL_ERROR),
    ("RST_STREAM of 3 bytes", lambda p: frame(RST_STREAM, 0, 1, b"\0\0\0"), FRAME_SIZE_ERROR),
    ("WINDOW_UPDATE of 5 bytes", lambda p: frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\0\1"), FRAME_SIZE_ERROR),
    ("PING of 7 bytes", lambda p: frame(PING, 0, 0, b"1234567"), FRAME_SIZE_ERROR),
    ("PING on a stream", lambda p: frame(PING, 0, 1, b"12345678"), PROTOCOL_ERROR),
    ("SETTINGS ACK with a payload", lambda p: frame(SETTINGS, ACK, 0, struct.pack(">HI", 4, 1)), FRAME_SIZE_ERROR),
    ("SETTINGS of 5 bytes", lambda p: frame(SETTINGS, 0, 0, b"\0\4\0\0\0"), FRAME_SIZE_ERROR),
    ("SETTINGS on a stream", lambda p: frame(SETTINGS, 0, 1, b""), PROTOCOL_ERROR),
    ("SETTINGS_ENABLE_PUSH 2", lambda p: settings({ENABLE_PUSH: 2}), PROTOCOL_ERROR),
    ("SETTINGS_INITIAL_WINDOW_SIZE 2^31", lambda p: settings({INITIAL_WINDOW_SIZE: 1 << 31}), FLOW_CONTROL_ERROR),
    ("SETTINGS_MAX_FRAME_SIZE below 2^14", lambda p: settings({MAX_FRAME_SIZE: 16383}), PROTOCOL_ERROR),
    ("SETTINGS_MAX_FRAME_SIZE 2^24", lambda p: settings({MAX_FRAME_SIZE: 1 << 24}), PROTOCOL_ERROR),
    ("PRIORITY on stream 0", lambda p: priority(0, 1), PROTOCOL_ERROR),
    # no frame may be sent on an idle stream, so its stream error ends the connection
    ("PRIORITY on an idle stream depending on itself", lambda p: priority(1, 1), PROTOCOL_ERROR),
    ("PRIORITY of 4 bytes on an idle stream", lambda p: frame(PRIORITY, 0, 1, b"\0\0\0\3"), FRAME_SIZE_ERROR),
    ("HEADERS on an even stream", lambda p: p.headers(2, request_fields(), end_stream=True), PROTOCOL_ERROR),
    ("a stream id lower than the last", lambda p: p.headers(5, request_fields(), end_stream=True)
     + p.headers(3, request_fields(), end_stream=True), PROTOCOL_ERROR),
    ("PUSH_PROMISE from a client", lambda p: frame(PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\2"), PROTOCOL_ERROR),
    ("GOAWAY of 7 bytes", lambda p: frame(GOAWAY, 0, 0, b"\0" * 7), FRAME_SIZE_ERROR),
    ("GOAWAY on a stream", lambda p: frame(GOAWAY, 0, 1, b"\0" * 8), PROTOCOL_ERROR),
    ("a frame above SETTINGS_MAX_FRAME_SIZE", lambda p: frame(PING, 0, 0, b"\0" * 16385), FRAME_SIZE_ERROR),
    ("DATA with padding past its end", lambda p: p.headers(1, request_fields())
     + frame(DATA, PADDED | END_STREAM, 1, b"\x05abc"), PROTOCOL_ERROR),
    ("HEADERS with PRIORITY too short", lambda p: frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 1, b"\0\0"),
     FRAME_SIZE_ERROR),
    ("CONTINUATION without HEADERS", lambda p: frame(CONTINUATION, END_HEADERS, 1, b"\x82"), PROTOCOL_ERROR),
    ("HEADERS not continued", lambda p: frame(HEADERS, 0, 1, p.block(request_fields())[:4]) + ping(),
     PROTOCOL_ERROR),
    ("CONTINUATION of another stream", lambda p: frame(HEADERS, 0, 1, p.block(request_fields())[:4])
     + frame(CONTINUATION, END_HEADERS, 3, b"\x82"), PROTOCOL_ERROR),
    ("an undecodable field block", lambda p: frame(HEADERS, END_HEADERS, 1, b"\xbe"), 0x9),
    ("a field block above our cap", lambda p: frame(HEADERS, 0, 1, b"\x82") + b"".join(
        frame(CONTINUATION, 0, 1, b"\x82" * 16000) for _ in range(5)), ENHANCE_YOUR_CALM),
]


@pytest.mark.parametrize(("frames", "code"), [(f, c) for _, f, c in CONNECTION_ERRORS],
                         ids=[name for name, _, _ in CONNECTION_ERRORS])
def test_an_illegal_frame_is_a_connection_error_of_the_rfcs_kind(peer: Peer, frames: Callable[[Peer], bytes],
                                                                 code: int) -> None:
    peer.send(frames(peer))
    expect_connection_error(peer, code)


def test_the_preface_must_be_followed_by_settings(served: tuple[object, Toy, str]) -> None:
    client = Peer(served[2], send_settings=False)
    client.send(ping())
    expect_connection_error(client, PROTOCOL_ERROR)
    client.close()


def test_frames_on_closed_streams(peer: Peer) -> None:
    finish_call(peer, 1)
    # WINDOW_UPDATE, RST_STREAM and PRIORITY may cross our END_STREAM: ignored
    peer.send(window_update(1, 100), rst_stream(1, 8), priority(1, 0))
    assert peer.alive()
    assert not [f for f in peer.frames(wait=0.2) if f.stream == 1], "no frame on a closed stream"
    # DATA after both sides ended the stream: STREAM_CLOSED (RFC 9113 5.1, 6.1)
    peer.send(frame(DATA, END_STREAM, 1, b"late"))
    expect_connection_error(peer, STREAM_CLOSED)


def test_headers_on_a_closed_stream_is_a_stream_closed_connection_error(peer: Peer) -> None:
    finish_call(peer, 1)
    peer.send(peer.headers(1, request_fields(), end_stream=True))
    expect_connection_error(peer, STREAM_CLOSED)


def test_data_after_the_client_reset_the_stream_is_stream_closed(peer: Peer) -> None:
    peer.send(peer.headers(1, request_fields()), rst_stream(1, 8), frame(DATA, END_STREAM, 1, b"x"))
    expect_connection_error(peer, STREAM_CLOSED)


# ------------------------------------------------------------------ stream errors

def test_a_stream_window_increment_of_0_is_a_stream_error(peer: Peer) -> None:
    open_watch(peer, 1)
    peer.send(window_update(1, 0))
    expect_stream_error(peer, 1, PROTOCOL_ERROR)


def test_a_stream_window_past_2_31_is_a_stream_flow_control_error(peer: Peer) -> None:
    open_watch(peer, 1)
    peer.send(window_update(1, 0x7FFFFFFF))
    expect_stream_error(peer, 1, FLOW_CONTROL_ERROR)


def test_a_priority_of_the_wrong_length_on_an_open_stream_is_a_stream_error(peer: Peer) -> None:
    open_watch(peer, 1)
    peer.send(frame(PRIORITY, 0, 1, b"\0\0\0\0"))
    expect_stream_error(peer, 1, FRAME_SIZE_ERROR)


def test_a_stream_depending_on_itself_is_a_stream_error(peer: Peer) -> None:
    block = peer.block(request_fields())
    peer.send(frame(HEADERS, END_HEADERS | END_STREAM | PRIORITY_FLAG, 1, struct.pack(">IB", 1, 15) + block))
    seen = expect_stream_error(peer, 1, PROTOCOL_ERROR)
    assert not [f for f in seen if f.kind == HEADERS and f.stream == 1], "no answer to a refused stream"
    open_watch(peer, 3)
    peer.send(priority(3, 3))
    expect_stream_error(peer, 3, PROTOCOL_ERROR)


def test_data_on_a_half_closed_stream_is_stream_closed_and_ends_its_watch(
        served: tuple[object, Toy, str], peer: Peer) -> None:
    _, toy, _ = served
    open_watch(peer, 1)
    peer.send(frame(DATA, 0, 1, b"more"))
    expect_stream_error(peer, 1, STREAM_CLOSED)
    assert toy.watches[0].closed.wait(2), "the watch of a reset stream must end"


def test_a_second_headers_with_end_stream_on_an_open_watch_ends_it_and_sends_nothing_more(
        served: tuple[object, Toy, str], peer: Peer) -> None:
    server, toy, _ = served
    open_watch(peer, 1)
    peer.send(peer.headers(1, [(b"x-trailer", b"1")], end_stream=True))
    expect_stream_error(peer, 1, STREAM_CLOSED)
    assert toy.watches[0].closed.wait(2)
    toy.version += 1
    server.wake()
    assert peer.alive()
    assert not [f for f in peer.frames(wait=0.3) if f.stream == 1], "DATA on a stream after its RST_STREAM"


def test_a_second_headers_without_end_stream_is_a_stream_error(peer: Peer) -> None:
    peer.send(peer.headers(1, request_fields()), peer.headers(1, [(b"x-more", b"1")]))
    expect_stream_error(peer, 1, PROTOCOL_ERROR)


def test_trailers_with_a_pseudo_header_are_malformed(peer: Peer) -> None:
    peer.send(peer.headers(1, request_fields()), frame(DATA, 0, 1, grpc_message(allocate_request("a"))),
              peer.headers(1, [(b":path", b"/x")], end_stream=True))
    expect_stream_error(peer, 1, PROTOCOL_ERROR)


def test_trailers_without_pseudo_headers_end_the_request(peer: Peer) -> None:
    peer.send(peer.headers(1, request_fields()), frame(DATA, 0, 1, grpc_message(allocate_request("t"))),
              peer.headers(1, [(b"x-trailer", b"ok")], end_stream=True))
    fields, _, _ = peer.response(1)
    assert fields[b"grpc-status"] == b"0"


def test_streams_beyond_the_advertised_limit_are_refused(served: tuple[object, Toy, str]) -> None:
    client = Peer(served[2], {INITIAL_WINDOW_SIZE: 0})  # no answer can finish: every stream stays open
    limit = client.handshake()[MAX_CONCURRENT_STREAMS]
    client.send(*(client.call(1 + 2 * i, allocate_request("x")) for i in range(limit + 1)))
    refused = 1 + 2 * limit
    expect_stream_error(client, refused, REFUSED_STREAM)
    client.send(frame(DATA, END_STREAM, refused, b"late"))  # data crossing our RST_STREAM: ignored
    assert client.alive()
    client.close()


# ------------------------------------------------------------------ requests and answers

MALFORMED = [
    ("an uppercase field name", request_fields(extra=[(b"X-Upper", b"1")])),
    ("an unknown pseudo-header", [(b":foo", b"bar"), *request_fields()]),
    ("a response pseudo-header", [(b":status", b"200"), *request_fields()]),
    ("a pseudo-header after a regular field", [*request_fields(), (b":authority", b"x")]),
    ("two :method", [(b":method", b"POST"), *request_fields()]),
    ("two :path", [(b":path", ALLOCATE.encode()), *request_fields()]),
    ("two :scheme", [(b":scheme", b"http"), *request_fields()]),
    ("no :method", [f for f in request_fields() if f[0] != b":method"]),
    ("no :scheme", [f for f in request_fields() if f[0] != b":scheme"]),
    ("no :path", [f for f in request_fields() if f[0] != b":path"]),
    ("an empty :path", [(b":path", b"") if f[0] == b":path" else f for f in request_fields()]),
    ("a connection header", request_fields(extra=[(b"connection", b"keep-alive")])),
    ("a transfer-encoding header", request_fields(extra=[(b"transfer-encoding", b"chunked")])),
    ("te other than trailers", [(b"te", b"gzip") if f[0] == b"te" else f for f in request_fields()]),
    ("a value with a line feed", request_fields(extra=[(b"x-a", b"1\n2")])),
    ("a value ending in a space", request_fields(extra=[(b"x-a", b"1 ")])),
    ("a name with a colon", request_fields(extra=[(b"x:a", b"1")])),
    ("host unlike :authority", request_fields(extra=[(b"host", b"elsewhere")])),
    ("CONNECT with a :path", [(b":method", b"CONNECT") if f[0] == b":method" else f for f in request_fields()]),
    ("a content-length that is not a number", request_fields(extra=[(b"content-length", b"-1")])),
]


@pytest.mark.parametrize("fields", [f for _, f in MALFORMED], ids=[name for name, _ in MALFORMED])
def test_a_malformed_request_is_a_stream_protocol_error_and_gets_no_answer(
        peer: Peer, fields: list[tuple[bytes, bytes]]) -> None:
    peer.send(peer.headers(1, fields), frame(DATA, END_STREAM, 1, grpc_message(allocate_request("a"))))
    seen = expect_stream_error(peer, 1, PROTOCOL_ERROR)
    assert not [f for f in seen if f.kind == HEADERS], "a malformed request gets no response"


@pytest.mark.parametrize(("length", "body"), [(b"3", b"ab"), (b"1", b"abc"), (b"5", b"")])
def test_a_content_length_unlike_the_data_is_malformed(peer: Peer, length: bytes, body: bytes) -> None:
    fields = request_fields(method=b"GET", extra=[(b"content-length", length)])
    peer.send(peer.headers(1, fields, end_stream=not body), *([frame(DATA, END_STREAM, 1, body)] if body else []))
    expect_stream_error(peer, 1, PROTOCOL_ERROR)


@pytest.mark.parametrize(("fields", "status"), [
    (request_fields(method=b"GET"), b"405"),
    ([(b"content-type", b"text/plain") if f[0] == b"content-type" else f for f in request_fields()], b"415"),
    (request_fields(extra=[(b"x-big", b"v" * 17000)]), b"431"),
])
def test_a_request_that_is_not_grpc_gets_an_http_status_and_a_line_of_text(
        peer: Peer, fields: list[tuple[bytes, bytes]], status: bytes) -> None:
    block = peer.block(fields)
    chunks = [block[i:i + 16000] for i in range(0, len(block), 16000)]
    frames = [frame(HEADERS if i == 0 else CONTINUATION, END_HEADERS if i == len(chunks) - 1 else 0, 1, chunk)
              for i, chunk in enumerate(chunks)]
    peer.send(*frames, frame(DATA, END_STREAM, 1, b"body"))
    headers, body, seen = peer.response(1)
    assert headers[b":status"] == status
    assert headers[b"content-type"].startswith(b"text/plain") and body.startswith(status + b": this is a gRPC")
    assert int(headers[b"content-length"]) == len(body)
    assert not [f for f in seen if f.kind == RST_STREAM], "the request was complete: no RST_STREAM"
    assert peer.alive()


def test_a_unary_answer_is_headers_one_message_and_ok_trailers_on_its_stream(peer: Peer) -> None:
    peer.send(peer.call(7, allocate_request("a", "b")))
    fields, data, seen = peer.response(7)
    frames = [f for f in seen if f.stream == 7]
    assert [(f.kind, f.flags) for f in frames] == [(HEADERS, END_HEADERS), (DATA, 0),
                                                   (HEADERS, END_HEADERS | END_STREAM)]
    assert fields == {b":status": b"200", b"content-type": b"application/grpc", b"grpc-status": b"0"}
    assert data[:5] == struct.pack(">BI", 0, len(data) - 5)
    answer = wire.AllocateResponse.FromString(data[5:])
    assert answer.container_responses[0].envs == {"IDS": "a,b"}


def test_a_rejected_request_that_ended_with_its_headers_gets_no_rst_stream(peer: Peer) -> None:
    # the trailers-only answer closes the stream: a RST_STREAM after it would be on a closed stream
    peer.send(peer.headers(1, request_fields("/v1beta1.DevicePlugin/Nope"), end_stream=True))
    fields, _, _ = peer.response(1)
    assert fields[b"grpc-status"] == b"12"
    assert peer.alive()
    assert not [f for f in peer.frames(wait=0.3) if f.stream == 1]


def test_an_early_answer_asks_the_client_to_stop_and_drops_the_rest(peer: Peer) -> None:
    peer.send(peer.headers(1, request_fields("/v1beta1.DevicePlugin/Nope")))
    fields, _, seen = peer.response(1)
    assert fields[b"grpc-status"] == b"12"
    after = peer.until(lambda f: f.kind == RST_STREAM and f.stream == 1)
    assert after[-1].error_code == NO_ERROR, "RST_STREAM NO_ERROR right after the trailers (RFC 9113 8.1)"
    peer.send(frame(DATA, END_STREAM, 1, grpc_message(b"late")))  # crossed our RST_STREAM: ignored
    assert peer.alive()
    finish_call(peer, 3)


def test_a_shrunk_header_table_is_announced_in_the_next_field_block(peer: Peer) -> None:
    peer.send(settings({HEADER_TABLE_SIZE: 0}))
    peer.until(lambda f: f.kind == SETTINGS and f.flags & ACK)
    peer.decoder.header_table_size = 0
    peer.send(peer.call(1, allocate_request("a")))
    first = peer.until(lambda f: f.kind == HEADERS and f.stream == 1)[-1]
    assert first.payload[:1] == b"\x20", "a dynamic table size update to 0 opens the block"
    fields, _, _ = peer.response(1)
    assert fields[b"grpc-status"] == b"0"


def test_ignored_frames_change_nothing(peer: Peer) -> None:
    peer.send(frame(0x42, 0xFF, 0, b"an extension frame"),  # unknown type: ignored (RFC 9113 4.1)
              priority(7, 0),  # PRIORITY on an idle stream
              frame(PING, ACK, 0, b"unsolicit"[:8]))
    assert peer.alive()
    finish_call(peer, 1)


def test_after_the_clients_goaway_its_calls_are_answered_and_the_connection_closes(peer: Peer) -> None:
    peer.send(peer.call(1, allocate_request("g")), frame(GOAWAY, 0, 0, struct.pack(">II", 1, NO_ERROR)))
    fields, _, _ = peer.response(1)
    assert fields[b"grpc-status"] == b"0"
    assert closed_by_server(peer), "no stream left after the client's GOAWAY: the server closes"


def test_a_stream_opened_after_the_clients_goaway_is_refused(peer: Peer) -> None:
    open_watch(peer, 1)  # keeps the connection open
    peer.send(frame(GOAWAY, 0, 0, struct.pack(">II", 1, NO_ERROR)), peer.call(3, allocate_request("late")))
    expect_stream_error(peer, 3, REFUSED_STREAM)
