"""A gRPC server for the device plugin API: one thread, one epoll loop, HTTP/2 on a Unix socket.

Why not grpcio's server: it hands every call from its completion-queue thread to a pool
worker and back, several thread switches per call; measured with a Go client (the
kubelet's grpc-go) that cost ~0.28 ms of CPU per call where a Go server spends ~0.07 ms
(bench/kubelet_bench.py). Here a call is read, handled and answered in one pass of the
loop, with one write. Handlers are short (the policy core), so they run on the loop.

Server streaming (ListAndWatch) holds no thread: a stream handler returns a `Watch` that
the loop polls whenever `wake()` is called (the device state changed) and that says what to
send and whether the stream is over. So open streams can never starve unary calls.

HTTP/2 as RFC 9113 says for a server, and gRPC as its PROTOCOL-HTTP2 document says: every
illegal frame or stream state is a connection error (GOAWAY, then close) or a stream error
(RST_STREAM) of the kind the RFC names; no frame is sent on a closed stream; a malformed
request (api/request_headers.py) is a stream error; a request that is not gRPC gets 405 or
415. Memory is bounded whatever the peer does: request bodies by our flow-control windows
(credit goes back only once a request is consumed), the output buffer by OUT_LIMIT (the
connection stops reading while above it), a ListAndWatch stream by keeping only the newest
unsent snapshot, header blocks, closed-stream memory and open streams by fixed caps.

Supported: unary and server-streaming calls, identity encoding (uncompressed; what the
kubelet and grpcio send by default), flow control both ways, PING, GOAWAY, RST_STREAM,
CONTINUATION, HPACK (the hpack library, via h2.py). Deadlines are not enforced on our side
(handlers take microseconds); the client enforces its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from . import h2
from .request_headers import Malformed, check_trailers, parse_request
from .status import RpcFailure, StatusCode, encode_message

log = logging.getLogger(__name__)

# The largest request message (gRPC's default receive limit). The largest real one is a
# GetPreferredAllocation naming every device: 64 GPUs x 256 replicas, under 1 MiB.
MAX_MESSAGE = 4 * 1024 * 1024
MAX_STREAMS_PER_CONNECTION = 100
# Connection and stream receive window: one largest message fits. Credit goes back only for
# data we are done with, so a connection never holds more than this in request bodies.
RECEIVE_WINDOW = MAX_MESSAGE + 5 + h2.DEFAULT_MAX_FRAME
MAX_HEADER_LIST = 16 * 1024  # what we advertise; larger lists are answered 431 (RFC 9113 10.5.1)
_DECODE_LIMIT = 4 * MAX_HEADER_LIST  # beyond it hpack stops mid-block: the connection ends
_MAX_BLOCK = 4 * MAX_HEADER_LIST  # a compressed field block (HEADERS + CONTINUATION) at most
# Output buffered for a peer that does not read: above OUT_LIMIT the connection stops
# reading and parsing (no more PING/SETTINGS answers, no more calls) until it drains to half.
OUT_LIMIT = 256 * 1024
_REMEMBERED_CLOSED = 256  # closed streams whose late frames we can still tell apart (RFC 9113 5.1)
_CLOSE_GRACE = 1.0  # seconds a connection ended by an error has to take its GOAWAY
_MAX_DETAILS = 1000  # characters of grpc-message: trailers stay one small frame
_READ_SIZE = 64 * 1024
_READ, _WRITE = select.EPOLLIN, select.EPOLLOUT
_HANGUP = select.EPOLLHUP | select.EPOLLERR

_OUR_SETTINGS = h2.settings({
    h2.ENABLE_PUSH: 0,
    h2.MAX_CONCURRENT_STREAMS: MAX_STREAMS_PER_CONNECTION,
    h2.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW,
    h2.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
}) + h2.window_update(0, RECEIVE_WINDOW - h2.DEFAULT_WINDOW)
_RESPONSE_HEADERS = h2.header_block([(b":status", b"200"), (b"content-type", b"application/grpc")])
_OK_TRAILERS = h2.header_block([(b"grpc-status", b"0")])
_TABLE_SIZE_ZERO = b"\x20"  # HPACK dynamic table size update to 0: we never index anything
# A unary answer (response headers, one DATA frame with the message, OK trailers) is two packs
# around the message: a third of the time of making its three frames one by one.
_ANSWER_HEAD = struct.Struct(f">HBBBI{len(_RESPONSE_HEADERS)}sHBBBIBI")
_ANSWER_TAIL = struct.Struct(f">HBBBI{len(_OK_TRAILERS)}s")


class Watch(Protocol):
    """What a server-streaming handler returns; the loop calls it, never another thread.

    Every message is a full snapshot: while a peer is slow, only the newest unsent one is kept.
    """

    def poll(self) -> tuple[list[Any], bool]:
        """Messages to send now, and whether the stream is over (ends with status OK)."""
        ...

    def close(self) -> None:
        """The stream ended, however (finished, cancelled, reset, connection gone, server stopped)."""
        ...


class Method(NamedTuple):
    request_class: Any  # a protobuf message class: FromString
    handler: Callable[[Any, CallContext], Any]  # unary: the response; streaming: a Watch
    streaming: bool


class CallContext:
    """The handler's view of its call (the subset of grpc.ServicerContext the servicer uses)."""

    __slots__ = ("method",)

    def __init__(self, method: str) -> None:
        self.method = method

    def abort(self, code: StatusCode, details: str) -> None:
        raise RpcFailure(code, details)


def _status_fields(code: StatusCode, details: str) -> list[tuple[bytes, bytes]]:
    fields = [(b"grpc-status", str(int(code)).encode())]
    if details:
        fields.append((b"grpc-message", encode_message(details[:_MAX_DETAILS])))
    return fields


def _trailers_only(code: StatusCode, details: str, extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    return h2.header_block([(b":status", b"200"), (b"content-type", b"application/grpc"),
                            *_status_fields(code, details), *extra])


def _error_trailers(code: StatusCode, details: str) -> bytes:
    return h2.header_block(_status_fields(code, details))


class _Route:
    """What a request's header block asks for, decided once per distinct block."""

    __slots__ = ("path", "method", "encoding", "content_length", "malformed", "http_status", "error")

    def __init__(self, path: str, method: Method | None, encoding: bytes, content_length: int | None,
                 malformed: str, http_status: int, error: tuple[StatusCode, str] | None) -> None:
        self.path = path
        self.method = method
        self.encoding = encoding
        self.content_length = content_length
        self.malformed = malformed  # a stream error of type PROTOCOL_ERROR; "" when well-formed
        self.http_status = http_status  # not gRPC: answered with this status once complete; 0 when gRPC
        self.error = error  # a gRPC error answered at once


class _Stream:
    __slots__ = ("id", "method", "path", "encoding", "body", "held", "recv_window", "received", "content_length",
                 "send_window", "pending", "offset", "queued", "final", "final_is_data", "headers_sent", "watch",
                 "remote_closed", "discard", "http_status")

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.method: Method | None = None
        self.path = ""
        self.encoding = b""
        self.body = bytearray()
        self.held = 0  # DATA bytes (with padding) received and not yet given back to the connection window
        self.recv_window = RECEIVE_WINDOW
        self.received = 0  # DATA payload bytes, for content-length
        self.content_length: int | None = None
        self.send_window = send_window
        self.pending = b""  # the message being sent (gRPC-framed), from `offset` on
        self.offset = 0
        self.queued: Any = None  # the newest message not yet started: replaced, never appended
        self.final: bytes | None = None  # the closing header block, sent after every message
        self.final_is_data = False  # an HTTP (not gRPC) answer: the stream ends with an empty DATA frame
        self.headers_sent = False
        self.watch: Watch | None = None
        self.remote_closed = False  # the client sent END_STREAM
        self.discard = False  # the request is answered or refused: its data is counted and dropped
        self.http_status = 0


class _Connection:
    def __init__(self, server: Server, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.fd = sock.fileno()
        self.inbuf = bytearray()
        self.out = bytearray()
        self.preface_seen = False
        self.settings_seen = False
        self.decoder = h2.HeaderDecoder(_DECODE_LIMIT)
        self.peer_max_frame = h2.DEFAULT_MAX_FRAME
        self.peer_initial_window = h2.DEFAULT_WINDOW
        self.peer_table_size = 4096  # the size our HPACK encoder may use; we announce 0 once it shrinks
        self.table_update = False
        self.send_window = h2.DEFAULT_WINDOW
        self.recv_window = RECEIVE_WINDOW  # what the client may still send on the connection
        self.consumed = 0  # bytes we are done with, not yet given back in a WINDOW_UPDATE
        self.streams: dict[int, _Stream] = {}
        # the newest closed streams, oldest first -> whether we reset them (their late frames are ignored)
        self.closed_ids: dict[int, bool] = {}
        self.last_stream_id = 0
        self.continuation: tuple[int, int, bytearray, bool] | None = None  # stream, flags, block, self-dependent
        self.going_away = False  # the client sent GOAWAY: no new streams
        self.closing = False  # we sent GOAWAY for an error: nothing more is read; closed once flushed
        self.paused = False  # OUT_LIMIT reached: no reading, no parsing until the output drains
        self.closed = False
        self.interest = _READ
        # header block -> (table generation, route): a client such as grpc-go sends the same
        # fully indexed block for every call of a method, so decoding and routing it once is enough
        self._routes: dict[bytes, tuple[int, _Route]] = {}
        self.out += _OUR_SETTINGS

    # ------------------------------------------------------------ input

    def on_readable(self) -> None:
        if self.paused or self.closing:
            return
        try:
            data = self.sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        self.inbuf += data
        self._process()

    def _process(self) -> None:
        try:
            self._parse()
        except h2.ProtocolError as error:
            self.connection_error(error.code, str(error))

    def _parse(self) -> None:
        buf = self.inbuf
        pos = 0
        if not self.preface_seen:
            if len(buf) < len(h2.PREFACE):
                if not h2.PREFACE.startswith(bytes(buf)):
                    raise h2.ProtocolError("not an HTTP/2 client")
                return
            if buf[: len(h2.PREFACE)] != h2.PREFACE:
                raise h2.ProtocolError("not an HTTP/2 client")
            pos = len(h2.PREFACE)
            self.preface_seen = True
        size = len(buf)
        out = self.out
        try:
            while size - pos >= 9 and not self.closing:
                if len(out) >= OUT_LIMIT:  # the peer is not reading: read nothing more until it does
                    self.paused = True
                    break
                length, kind, flags, stream_id = h2.parse_header(buf, pos)
                if length > h2.DEFAULT_MAX_FRAME:  # we never raise SETTINGS_MAX_FRAME_SIZE
                    raise h2.ProtocolError(f"a {length}-byte frame is above our maximum", h2.FRAME_SIZE_ERROR)
                if size - pos - 9 < length:
                    break
                payload = bytes(buf[pos + 9:pos + 9 + length])
                pos += 9 + length
                if not self.settings_seen and (kind != h2.SETTINGS or flags & h2.ACK):
                    raise h2.ProtocolError("the client preface must end with a SETTINGS frame")
                try:
                    self._frame(kind, flags, stream_id, payload)
                except h2.StreamError as error:
                    self._stream_error(stream_id, error)
        finally:
            del buf[:pos]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuation is not None and kind != h2.CONTINUATION:
            raise h2.ProtocolError("a field block was not continued with CONTINUATION")
        if kind == h2.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == h2.DATA:
            self._data(flags, stream_id, payload)
        elif kind == h2.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == h2.PING:
            if stream_id:
                raise h2.ProtocolError("PING on a stream")
            if len(payload) != 8:
                raise h2.ProtocolError("a PING payload is 8 bytes", h2.FRAME_SIZE_ERROR)
            if not flags & h2.ACK:
                self.out += h2.frame(h2.PING, h2.ACK, 0, payload)
        elif kind == h2.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == h2.CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == h2.RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == h2.PRIORITY:
            self._priority(stream_id, payload)
        elif kind == h2.GOAWAY:
            if stream_id:
                raise h2.ProtocolError("GOAWAY on a stream")
            if len(payload) < 8:
                raise h2.ProtocolError("a GOAWAY payload is at least 8 bytes", h2.FRAME_SIZE_ERROR)
            self.going_away = True
        elif kind == h2.PUSH_PROMISE:
            raise h2.ProtocolError("a client must not push")
        # frame types we do not know are ignored, as RFC 9113 section 4.1 requires

    def _idle(self, stream_id: int) -> bool:
        """Never opened: a client opens odd streams only, in increasing order, and we push none."""
        return stream_id % 2 == 0 or stream_id > self.last_stream_id

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise h2.ProtocolError("SETTINGS on a stream")
        if flags & h2.ACK:
            if payload:
                raise h2.ProtocolError("a SETTINGS acknowledgement with a payload", h2.FRAME_SIZE_ERROR)
            return
        values = h2.parse_settings(payload)
        self.settings_seen = True
        if values.get(h2.ENABLE_PUSH, 0) > 1:
            raise h2.ProtocolError("SETTINGS_ENABLE_PUSH must be 0 or 1")
        if h2.MAX_FRAME_SIZE in values:
            if not h2.DEFAULT_MAX_FRAME <= values[h2.MAX_FRAME_SIZE] <= (1 << 24) - 1:
                raise h2.ProtocolError("invalid SETTINGS_MAX_FRAME_SIZE")
            self.peer_max_frame = values[h2.MAX_FRAME_SIZE]
        if values.get(h2.HEADER_TABLE_SIZE, self.peer_table_size) < self.peer_table_size:
            self.peer_table_size = 0  # announced in our next field block (RFC 7541 4.2)
            self.table_update = True
        if h2.INITIAL_WINDOW_SIZE in values:
            window = values[h2.INITIAL_WINDOW_SIZE]
            if window > h2.MAX_WINDOW:
                raise h2.ProtocolError("invalid SETTINGS_INITIAL_WINDOW_SIZE", h2.FLOW_CONTROL_ERROR)
            delta = window - self.peer_initial_window
            self.peer_initial_window = window
            for stream in self.streams.values():
                stream.send_window += delta
                if stream.send_window > h2.MAX_WINDOW:
                    raise h2.ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE pushed a stream window past 2^31-1",
                                           h2.FLOW_CONTROL_ERROR)
        self.out += h2.frame(h2.SETTINGS, h2.ACK, 0)
        self._push_all()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise h2.ProtocolError("a WINDOW_UPDATE payload is 4 bytes", h2.FRAME_SIZE_ERROR)
        increment = h2.u31(payload)
        if stream_id == 0:
            if not increment:
                raise h2.ProtocolError("a connection window increment of 0")
            self.send_window += increment
            if self.send_window > h2.MAX_WINDOW:
                raise h2.ProtocolError("the connection window past 2^31-1", h2.FLOW_CONTROL_ERROR)
            self._push_all()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if self._idle(stream_id):
                raise h2.ProtocolError(f"WINDOW_UPDATE on idle stream {stream_id}")
            return  # closed: a window update may cross our END_STREAM or RST_STREAM
        if not increment:
            raise h2.StreamError("a stream window increment of 0")
        stream.send_window += increment
        if stream.send_window > h2.MAX_WINDOW:
            raise h2.StreamError("the stream window past 2^31-1", h2.FLOW_CONTROL_ERROR)
        self._push(stream)

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise h2.ProtocolError("a RST_STREAM payload is 4 bytes", h2.FRAME_SIZE_ERROR)
        if stream_id == 0:
            raise h2.ProtocolError("RST_STREAM on stream 0")
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._close_stream(stream)  # closed by the client: nothing more is sent on it
        elif self._idle(stream_id):
            raise h2.ProtocolError(f"RST_STREAM on idle stream {stream_id}")

    def _priority(self, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise h2.ProtocolError("PRIORITY on stream 0")
        if len(payload) != 5:
            raise h2.StreamError("a PRIORITY payload is 5 bytes", h2.FRAME_SIZE_ERROR)
        if h2.u31(payload) == stream_id:
            raise h2.StreamError(f"stream {stream_id} depends on itself")

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise h2.ProtocolError("HEADERS on stream 0")
        block = h2.unpadded(payload, flags)
        self_dependent = False
        if flags & h2.PRIORITY_FLAG:
            if len(block) < 5:
                raise h2.ProtocolError("HEADERS too short for its priority fields", h2.FRAME_SIZE_ERROR)
            self_dependent = h2.u31(block) == stream_id
            block = block[5:]
        if flags & h2.END_HEADERS:
            self._header_block(stream_id, flags, block, self_dependent)
        else:
            self.continuation = (stream_id, flags, bytearray(block), self_dependent)

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuation is None or self.continuation[0] != stream_id:
            raise h2.ProtocolError("CONTINUATION without HEADERS on that stream")
        _, first_flags, block, self_dependent = self.continuation
        block += payload
        if len(block) > _MAX_BLOCK:
            raise h2.ProtocolError("a field block larger than we take", h2.ENHANCE_YOUR_CALM)
        if flags & h2.END_HEADERS:
            self.continuation = None
            self._header_block(stream_id, first_flags, bytes(block), self_dependent)

    def _header_block(self, stream_id: int, flags: int, block: bytes, self_dependent: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:  # a second block: the request's trailers
            fields = self.decoder.decode(block)  # always: the dynamic table must stay in step
            if self_dependent:
                raise h2.StreamError(f"stream {stream_id} depends on itself")
            if stream.remote_closed:
                raise h2.StreamError("HEADERS after END_STREAM", h2.STREAM_CLOSED)
            if not flags & h2.END_STREAM:
                raise h2.StreamError("a second HEADERS block must end the stream")
            check_trailers(fields)
            self._end_of_request(stream)
            return
        if stream_id % 2 == 0:
            raise h2.ProtocolError(f"stream {stream_id} is even: a client opens odd streams only")
        if stream_id <= self.last_stream_id:
            self.decoder.decode(block)
            reset_by_us = self.closed_ids.get(stream_id)
            if reset_by_us:
                return  # its late frames are ignored
            if reset_by_us is None:  # RFC 9113 5.1.1: a new stream's id must be above every earlier one
                raise h2.ProtocolError(f"stream {stream_id} opened after stream {self.last_stream_id}")
            raise h2.ProtocolError(f"HEADERS on closed stream {stream_id}", h2.STREAM_CLOSED)
        route = self._route(block)
        self.last_stream_id = stream_id
        if self_dependent:
            self._reset_id(stream_id, h2.PROTOCOL_ERROR)
            return
        if self.going_away or len(self.streams) >= MAX_STREAMS_PER_CONNECTION:
            self._reset_id(stream_id, h2.REFUSED_STREAM)
            return
        stream = _Stream(stream_id, self.peer_initial_window)
        self.streams[stream_id] = stream
        stream.remote_closed = bool(flags & h2.END_STREAM)
        if route.malformed:
            raise h2.StreamError(route.malformed)
        stream.path, stream.content_length = route.path, route.content_length
        if route.http_status:
            stream.http_status, stream.discard = route.http_status, True
        elif route.error is not None:
            self._reject(stream, *route.error)
        else:
            stream.method, stream.encoding = route.method, route.encoding
        if stream.remote_closed:
            self._end_of_request(stream)

    def _route(self, block: bytes) -> _Route:
        generation = self.decoder.generation
        cached = self._routes.get(block)
        if cached is not None and cached[0] == generation:
            return cached[1]
        fields = self.decoder.decode(block)
        route = self._route_fields(fields)
        # replayable when decoding changed no table entry; small blocks only (grpc-go's are ~10 bytes),
        # so the cache holds kilobytes whatever a client sends
        if self.decoder.generation == generation and len(block) <= 256:
            if len(self._routes) >= 64:
                self._routes.clear()
            self._routes[block] = (generation, route)
        return route

    def _route_fields(self, fields: list[tuple[bytes, bytes]]) -> _Route:
        try:
            request = parse_request(fields)
        except Malformed as malformed:
            return _Route("", None, b"", None, str(malformed), 0, None)
        path, length = request.path, request.content_length
        if sum(len(name) + len(value) + 32 for name, value in fields) > MAX_HEADER_LIST:
            return _Route(path, None, b"", length, "", 431, None)
        if request.method != b"POST":
            return _Route(path, None, b"", length, "", 405, None)
        if not request.content_type.startswith(b"application/grpc"):
            return _Route(path, None, b"", length, "", 415, None)
        method = self.server.methods.get(path)
        if method is None:
            return _Route(path, None, b"", length, "", 0, (StatusCode.UNIMPLEMENTED, f"Method not found: {path}"))
        return _Route(path, method, request.encoding, length, "", 0, None)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise h2.ProtocolError("DATA on stream 0")
        length = len(payload)  # padding included: it counts against flow control
        self.recv_window -= length
        if self.recv_window < 0:
            raise h2.ProtocolError("the client overran our connection window", h2.FLOW_CONTROL_ERROR)
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            self._give_back(length)
            if stream is not None:
                raise h2.StreamError("DATA after END_STREAM", h2.STREAM_CLOSED)
            if self._idle(stream_id):
                raise h2.ProtocolError(f"DATA on idle stream {stream_id}")
            if not self.closed_ids.get(stream_id):
                raise h2.ProtocolError(f"DATA on closed stream {stream_id}", h2.STREAM_CLOSED)
            return  # we reset it: its late data is dropped
        stream.held += length
        data = h2.unpadded(payload, flags)
        stream.recv_window -= length
        if stream.recv_window < 0:
            raise h2.StreamError("the client overran the stream's window", h2.FLOW_CONTROL_ERROR)
        stream.received += len(data)
        if stream.content_length is not None and stream.received > stream.content_length:
            raise h2.StreamError("more DATA than content-length")
        if stream.discard:
            self._give_back(stream.held)
            stream.held = 0
        else:
            stream.body += data
            if len(stream.body) > MAX_MESSAGE + 5:
                self._reject(stream, StatusCode.RESOURCE_EXHAUSTED,
                             f"Received message larger than max ({len(stream.body) - 5} vs. {MAX_MESSAGE})")
                if stream.id not in self.streams:
                    return
        if flags & h2.END_STREAM:
            self._end_of_request(stream)

    def _give_back(self, length: int) -> None:
        """Credit for `length` bytes we are done with; a WINDOW_UPDATE once half the window is due."""
        self.consumed += length
        if self.consumed >= RECEIVE_WINDOW // 2:
            self.out += h2.window_update(0, self.consumed)
            self.recv_window += self.consumed
            self.consumed = 0

    # ------------------------------------------------------------ calls

    def _end_of_request(self, stream: _Stream) -> None:
        stream.remote_closed = True
        if stream.content_length is not None and stream.received != stream.content_length:
            raise h2.StreamError(f"{stream.received} bytes of DATA where content-length says {stream.content_length}")
        if stream.http_status:
            self._answer_http(stream)
        elif not stream.discard:
            self._call(stream)

    def _call(self, stream: _Stream) -> None:
        method = stream.method
        assert method is not None
        body = stream.body
        stream.body = bytearray()
        self._give_back(stream.held)
        stream.held = 0
        if len(body) < 5:
            self._reject(stream, StatusCode.INTERNAL, "the request has no message")
            return
        compressed, length = struct.unpack_from(">BI", body)
        if compressed:
            if compressed != 1:
                self._reject(stream, StatusCode.INTERNAL, f"invalid compressed flag {compressed}")
            elif stream.encoding in (b"", b"identity"):  # gRPC: the flag needs a grpc-encoding
                self._reject(stream, StatusCode.INTERNAL, "compressed flag set with identity or empty encoding")
            else:
                self._reject(stream, StatusCode.UNIMPLEMENTED,
                             f"grpc-encoding {stream.encoding.decode('latin-1')[:40]} is not supported; send identity",
                             ((b"grpc-accept-encoding", b"identity"),))
            return
        if length != len(body) - 5:
            self._reject(stream, StatusCode.INTERNAL, "a unary request must carry exactly one message")
            return
        try:
            request = method.request_class.FromString(bytes(body[5:]))
        except Exception as exc:  # protobuf's DecodeError differs between runtimes
            self.server.request_log.warning("could not deserialize a %s request: %s", stream.path, exc)
            self._reject(stream, StatusCode.INTERNAL, "Exception deserializing request!")
            return
        try:
            result = method.handler(request, CallContext(stream.path))
        except RpcFailure as failure:
            self._reject(stream, failure.code, failure.details)
            return
        except Exception as exc:
            self.server.request_log.error("%s failed: %s: %s", stream.path, type(exc).__name__, exc)
            self._reject(stream, StatusCode.UNKNOWN, f"Exception calling application: {exc}")
            return
        if not method.streaming:
            self._answer(stream, result.SerializeToString())
            return
        stream.watch = result
        self.server.watching.add((self, stream))
        self.server.poll_watch(self, stream)

    def _answer(self, stream: _Stream, message: bytes) -> None:
        """A unary call's answer: headers, message and trailers in one write when the windows allow
        (they nearly always do), else through the flow-controlled path."""
        length = len(message) + 5
        if length <= self.send_window and length <= stream.send_window and length <= self.peer_max_frame \
                and not self.table_update and len(self.out) < OUT_LIMIT:
            sid = stream.id
            out = self.out
            out += _ANSWER_HEAD.pack(0, len(_RESPONSE_HEADERS), h2.HEADERS, h2.END_HEADERS, sid, _RESPONSE_HEADERS,
                                     length >> 8, length & 0xFF, h2.DATA, 0, sid, 0, len(message))
            out += message
            out += _ANSWER_TAIL.pack(0, len(_OK_TRAILERS), h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid,
                                     _OK_TRAILERS)
            self.send_window -= length
            del self.streams[sid]  # the request ended before we answered: the stream is closed
            self._remember_closed(sid, False)
            return
        self._start_response(stream)
        stream.pending, stream.offset = h2.grpc_message(message), 0
        stream.final = _OK_TRAILERS
        self._push(stream)

    def _answer_http(self, stream: _Stream) -> None:
        """A request that is not gRPC: an HTTP status and a line of text (gRPC's PROTOCOL-HTTP2: 415 for
        another content type; 405 for another method, as grpc-go answers; 431 for headers too large)."""
        status = stream.http_status
        reason = {405: "gRPC requests use POST", 415: "gRPC requests have content-type application/grpc",
                  431: f"request header fields above {MAX_HEADER_LIST} bytes"}[status]
        body = f"{status}: this is a gRPC server (kubelet device plugin API); {reason}\n".encode()
        self.out += self._header_frame(stream.id, 0, h2.header_block([
            (b":status", str(status).encode()), (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode())]))
        stream.headers_sent = True
        stream.pending, stream.offset = body, 0
        stream.final, stream.final_is_data = b"", True
        self._push(stream)

    def send_watch_messages(self, stream: _Stream, messages: list[Any], done: bool) -> None:
        if messages:
            stream.queued = messages[-1]  # full snapshots: the newest supersedes any unsent one
        if done:
            self._end_watch(stream)
            stream.final = _OK_TRAILERS
        self._push(stream)

    def end_watch_with(self, stream: _Stream, code: StatusCode, details: str) -> None:
        self._end_watch(stream)
        stream.queued = None
        if stream.headers_sent or stream.pending:
            stream.final = _error_trailers(code, details)
        else:
            stream.headers_sent = True
            stream.final = _trailers_only(code, details)
        self._push(stream)

    def _reject(self, stream: _Stream, code: StatusCode, details: str,
                extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """End a call with an error status; the rest of its request (if any) is dropped."""
        stream.discard = True
        stream.body = bytearray()
        self._give_back(stream.held)
        stream.held = 0
        if stream.headers_sent:
            stream.final = _error_trailers(code, details)
        else:
            stream.headers_sent = True
            stream.final = _trailers_only(code, details, extra)
        self._push(stream)

    def _start_response(self, stream: _Stream) -> None:
        if not stream.headers_sent:
            self.out += self._header_frame(stream.id, 0, _RESPONSE_HEADERS)
            stream.headers_sent = True

    def _header_frame(self, stream_id: int, flags: int, block: bytes) -> bytes:
        if self.table_update:  # the peer shrank its table: our next block says we use none
            block = _TABLE_SIZE_ZERO + block
            self.table_update = False
        return h2.frame(h2.HEADERS, flags | h2.END_HEADERS, stream_id, block)

    def _push(self, stream: _Stream) -> None:
        """Send what flow control and OUT_LIMIT allow of the stream's messages, then its closing frame."""
        out = self.out
        sid = stream.id
        while True:
            if stream.offset >= len(stream.pending) and stream.queued is not None:
                message, stream.queued = stream.queued, None
                self._start_response(stream)
                stream.pending, stream.offset = h2.grpc_message(message.SerializeToString()), 0
            pending, offset = stream.pending, stream.offset
            while offset < len(pending):
                allowed = min(self.send_window, stream.send_window, self.peer_max_frame, len(pending) - offset)
                if allowed <= 0 or len(out) >= OUT_LIMIT:
                    stream.offset = offset
                    return
                out += h2.frame(h2.DATA, 0, sid, pending[offset:offset + allowed])
                offset += allowed
                self.send_window -= allowed
                stream.send_window -= allowed
            stream.pending, stream.offset = b"", 0
            if stream.queued is None:
                break
        if stream.final is None:
            return
        if stream.final_is_data:
            out += h2.frame(h2.DATA, h2.END_STREAM, sid)
        else:
            out += self._header_frame(sid, h2.END_STREAM, stream.final)
        if stream.remote_closed:
            self._close_stream(stream)
        else:  # answered before the request ended: ask the client to stop (RFC 9113 8.1, gRPC)
            self._reset(stream, h2.NO_ERROR)

    def _push_all(self) -> None:
        for stream in list(self.streams.values()):
            if stream.pending or stream.queued is not None or stream.final is not None:
                self._push(stream)

    # ------------------------------------------------------------ ending streams

    def _stream_error(self, stream_id: int, error: h2.StreamError) -> None:
        """RST_STREAM for an open stream; on an idle or closed one no frame may be sent, so the
        connection ends instead (RFC 9113 5.4: a stream error may always be treated so)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            raise h2.ProtocolError(str(error), error.code)
        log.debug("resetting stream %d: %s", stream_id, error)
        self._reset(stream, error.code)

    def _reset(self, stream: _Stream, code: int) -> None:
        self.out += h2.rst_stream(stream.id, code)
        self._close_stream(stream, reset_by_us=True)

    def _reset_id(self, stream_id: int, code: int) -> None:
        self.out += h2.rst_stream(stream_id, code)
        self._remember_closed(stream_id, True)

    def _remember_closed(self, stream_id: int, reset_by_us: bool) -> None:
        closed = self.closed_ids
        closed[stream_id] = reset_by_us
        if len(closed) > _REMEMBERED_CLOSED:
            del closed[next(iter(closed))]

    def _close_stream(self, stream: _Stream, reset_by_us: bool = False) -> None:
        """However a stream ends: its watch ends, its slot and its held bytes go back."""
        self.streams.pop(stream.id, None)
        self._remember_closed(stream.id, reset_by_us)
        self._end_watch(stream)
        if stream.held:
            self._give_back(stream.held)
            stream.held = 0
        stream.pending, stream.queued, stream.body = b"", None, bytearray()

    def _end_watch(self, stream: _Stream) -> None:
        watch, stream.watch = stream.watch, None
        if watch is not None:
            self.server.watching.discard((self, stream))
            try:
                watch.close()
            except Exception:
                log.exception("closing a stream failed")

    # ------------------------------------------------------------ output and teardown

    def connection_error(self, code: int, message: str) -> None:
        """GOAWAY with `code`, then close once it is written (or after a grace period)."""
        if self.closing or self.closed:
            return
        log.debug("closing a client connection: %s", message)
        for stream in list(self.streams.values()):
            self._close_stream(stream)
        self.out += h2.goaway(self.last_stream_id, code, message.encode()[:200])
        self.closing = True
        self.paused = False
        self.inbuf.clear()
        self.continuation = None
        self.server.closing_at(self, time.monotonic() + _CLOSE_GRACE)
        self.flush()

    def flush(self) -> None:
        """Write what is queued; what the socket does not take now waits for EPOLLOUT. Resumes
        reading once a paused connection's output has drained to half of OUT_LIMIT."""
        while not self.closed:
            blocked = self._write()
            if self.closed:
                return
            if self.closing:
                if not self.out:
                    self.close()
                    return
                break
            if not (self.paused and len(self.out) < OUT_LIMIT // 2):
                break
            self.paused = False
            self._process()  # the frames left in the input buffer (may pause again)
            if not self.closing and not self.closed:
                self._push_all()
            if blocked:
                break
        if not self.closed:
            self._update_interest()

    def _write(self) -> bool:
        """True when the socket would block."""
        out = self.out
        while out:
            try:
                sent = self.sock.send(out)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                self.close()
                return True
            del out[:sent]
        return False

    def _update_interest(self) -> None:
        wanted = (0 if self.paused or self.closing else _READ) | (_WRITE if self.out else 0)
        if wanted != self.interest:
            self.interest = wanted
            self.server.set_interest(self, wanted)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for stream in list(self.streams.values()):
            self._close_stream(stream)
        self.streams.clear()
        self.out.clear()
        self.inbuf.clear()
        self.server.forget(self)
        with contextlib.suppress(OSError):
            self.sock.close()


class Server:
    """Serve `methods` (path -> Method) on one Unix socket from one thread."""

    def __init__(self, methods: Mapping[str, Method], request_log: logging.Logger | None = None) -> None:
        self.methods = dict(methods)
        self.request_log = request_log or log
        self.watching: set[tuple[_Connection, _Stream]] = set()
        self._epoll = select.epoll()
        self._connections: dict[int, _Connection] = {}  # by file descriptor
        self._closing: dict[_Connection, float] = {}  # connections ended by an error -> when to drop them
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._woken = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.stopped = threading.Event()

    def bind(self, path: str) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.bind(path)
            listener.listen(64)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self._listener = listener

    def start(self) -> None:
        assert self._listener is not None, "bind() first"
        self._epoll.register(self._listener.fileno(), _READ)
        self._epoll.register(self._wake_r, _READ)
        self._thread = threading.Thread(target=self._run, name="grpc-server", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """From any thread: poll every open stream (the state they watch may have changed)."""
        with self._wake_lock:
            if self._wake_w >= 0:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b"x")

    def stop(self, timeout: float = 2.0) -> None:
        """End every stream and connection, close the listener; returns once the loop has left."""
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._close_all()

    # ------------------------------------------------------------ loop (server thread only)

    def _run(self) -> None:
        assert self._listener is not None
        listener, wake, connections = self._listener.fileno(), self._wake_r, self._connections
        try:
            while not self._stopping:
                timeout = -1.0
                if self._closing:
                    timeout = max(0.0, min(self._closing.values()) - time.monotonic())
                for fd, mask in self._epoll.poll(timeout):
                    connection = connections.get(fd)
                    if connection is not None:
                        if mask & _HANGUP and (connection.paused or connection.closing):
                            connection.close()  # not reading: recv() would never say it is gone
                            continue
                        if mask & ~_WRITE:  # readable, or hung up / failed: recv() tells which
                            connection.on_readable()
                        if mask & _WRITE and not connection.closed:
                            connection.flush()
                    elif fd == wake:
                        self._drain_wake()
                        self._woken = True
                    elif fd == listener:
                        self._accept()
                if self._woken:
                    self._woken = False
                    for connection, stream in list(self.watching):
                        self.poll_watch(connection, stream)
                for connection in list(connections.values()):
                    if connection.out:
                        connection.flush()
                    if connection.going_away and not connection.streams and not connection.out \
                            and not connection.closed:
                        connection.close()  # the client said GOAWAY and has every answer
                if self._closing:
                    now = time.monotonic()
                    for connection, deadline in list(self._closing.items()):
                        if deadline <= now:
                            connection.close()
        except Exception:
            log.exception("the gRPC server loop failed")
        finally:
            self._close_all()

    def poll_watch(self, connection: _Connection, stream: _Stream) -> None:
        watch = stream.watch
        if watch is None:
            return
        try:
            messages, done = watch.poll()
        except Exception as exc:
            self.request_log.error("%s failed: %s: %s", stream.path, type(exc).__name__, exc)
            connection.end_watch_with(stream, StatusCode.UNKNOWN, f"Exception iterating responses: {exc}")
            return
        connection.send_watch_messages(stream, messages, done)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("accepting a connection failed: %s", exc)
                return
            sock.setblocking(False)
            connection = _Connection(self, sock)
            self._connections[connection.fd] = connection
            self._epoll.register(connection.fd, _READ)
            connection.flush()

    def set_interest(self, connection: _Connection, mask: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._epoll.modify(connection.fd, mask)

    def closing_at(self, connection: _Connection, deadline: float) -> None:
        self._closing[connection] = deadline

    def forget(self, connection: _Connection) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(connection.fd)
        self._connections.pop(connection.fd, None)
        self._closing.pop(connection, None)

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _close_all(self) -> None:
        deadline = time.monotonic() + 0.5  # last words for every connection together, never a hang
        for connection in list(self._connections.values()):
            if not connection.closing:
                for stream in list(connection.streams.values()):
                    self.poll_watch(connection, stream)  # a servicer that stopped ends its streams with OK
                    if stream.watch is not None:  # one it did not end: the server is going away
                        connection.end_watch_with(stream, StatusCode.UNAVAILABLE, "the device plugin is stopping")
                connection.out += h2.goaway(connection.last_stream_id, h2.NO_ERROR)
            _flush_blocking(connection, deadline)
            connection.close()
        self.watching.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._epoll.close()
        with self._wake_lock:
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake_r = self._wake_w = -1
        self.stopped.set()


def _flush_blocking(connection: _Connection, deadline: float) -> None:
    """Last words before closing (trailers, GOAWAY): a blocking write until `deadline`, never a hang."""
    if connection.closed or not connection.out:
        return
    with contextlib.suppress(OSError):
        connection.sock.settimeout(max(0.001, deadline - time.monotonic()))
        connection.sock.sendall(connection.out)
    connection.out.clear()
