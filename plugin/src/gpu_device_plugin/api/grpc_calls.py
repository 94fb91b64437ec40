"""gRPC over one HTTP/2 connection, as gRPC's PROTOCOL-HTTP2 document says: which method a
request's fields ask for, its length-prefixed message, the handler's answer or stream, and the
status in trailers. The HTTP/2 side (frames, states, windows) is `connection.py`'s.

Server streaming (ListAndWatch) holds no thread: a stream handler returns a `Watch` that the
loop polls whenever `Server.wake()` is called and that says what to send and whether the
stream is over. Every message it returns is a full snapshot, so while a peer is slow only the
newest unsent one is kept; one snapshot object returned to many streams is encoded once.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from . import h2
from .limits import MAX_HEADER_LIST
from .request_headers import Malformed, check_trailers, parse_request
from .status import RpcFailure, StatusCode, encode_message

if TYPE_CHECKING:
    from .connection import Connection
    from .streams import Stream

_MAX_DETAILS = 1000  # characters of grpc-message: trailers stay one small frame
RESPONSE_HEADERS = h2.header_block([(b":status", b"200"), (b"content-type", b"application/grpc")])
OK_TRAILERS = h2.header_block([(b"grpc-status", b"0")])
# A unary answer (response headers, one DATA frame with the message, OK trailers) is two packs
# around the message: a third of the time of making its three frames one by one.
_ANSWER_HEAD = struct.Struct(f">HBBBI{len(RESPONSE_HEADERS)}sHBBBIBI")
_ANSWER_TAIL = struct.Struct(f">HBBBI{len(OK_TRAILERS)}s")


class Watch(Protocol):
    """What a server-streaming handler returns; the loop calls it, never another thread.

    Every message is a full snapshot: while a peer is slow, only the newest unsent one is kept.
    Return the same object to every stream for the same state: it is then encoded once.
    """

    def poll(self) -> tuple[list[Any], bool]:
        """Messages to send now, and whether the stream is over (ends with status OK)."""
        ...

    def close(self) -> None:
        """The stream ended, however (finished, cancelled, reset, connection gone, server stopped)."""
        ...


class Method(NamedTuple):
    request_class: Any  # a message class with FromString (wire.py's or protobuf's)
    handler: Callable[[Any, CallContext], Any]  # unary: the response; streaming: a Watch
    streaming: bool


class CallContext:
    """The handler's view of its call (the subset of grpc.ServicerContext the servicer uses)."""

    __slots__ = ("method", "_connection")

    def __init__(self, method: str, connection: Any = None) -> None:
        self.method = method
        self._connection = connection

    def abort(self, code: StatusCode, details: str) -> None:
        raise RpcFailure(code, details)

    def serve_first(self) -> None:
        """This call's connection is the one that matters (the kubelet's): the server reads it first
        in every turn, never evicts it for a newer one, and never closes it for stalling."""
        if self._connection is not None:
            self._connection.server.prefer(self._connection)


def _status_fields(code: StatusCode, details: str) -> list[tuple[bytes, bytes]]:
    fields = [(b"grpc-status", str(int(code)).encode())]
    if details:
        fields.append((b"grpc-message", encode_message(details[:_MAX_DETAILS])))
    return fields


def trailers_only(code: StatusCode, details: str, extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    return h2.header_block([(b":status", b"200"), (b"content-type", b"application/grpc"),
                            *_status_fields(code, details), *extra])


def error_trailers(code: StatusCode, details: str) -> bytes:
    return h2.header_block(_status_fields(code, details))


def is_grpc_content_type(value: bytes) -> bool:
    """application/grpc, or application/grpc followed by + (a message format) or ; (parameters)."""
    return value == b"application/grpc" or value[:17] in (b"application/grpc+", b"application/grpc;")


class Route:
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


class Call:
    __slots__ = ("method", "path", "encoding", "body", "queued", "watch", "discard", "http_status")

    def __init__(self, route: Route) -> None:
        self.method = route.method
        self.path = route.path
        self.encoding = route.encoding
        self.body = bytearray()
        self.queued: Any = None  # the newest snapshot not yet started: replaced, never appended
        self.watch: Watch | None = None
        self.discard = False  # the request is answered or refused: its data is counted and dropped
        self.http_status = route.http_status


class Encoded:
    """Snapshot objects -> their gRPC-framed bytes, for the few newest: many streams sent the same
    snapshot (one per device-state version) cost one encoding. Entries hold their object, so an
    id is never reused while it is here."""

    def __init__(self, size: int = 4) -> None:
        self._entries: dict[int, tuple[Any, bytes]] = {}
        self._size = size

    def get(self, message: Any) -> bytes:
        entry = self._entries.get(id(message))
        if entry is not None and entry[0] is message:
            return entry[1]
        framed = h2.grpc_message(message.SerializeToString())
        if len(self._entries) >= self._size:
            del self._entries[next(iter(self._entries))]
        self._entries[id(message)] = (message, framed)
        return framed


class Calls:
    """The gRPC calls of one connection."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.server = connection.server
        # header block -> (table generation, route): a client such as grpc-go sends the same fully
        # indexed block for every call of a method, so decoding and routing it once is enough
        self._routes: dict[bytes, tuple[int, Route]] = {}

    # ------------------------------------------------------------ requests

    def route(self, block: bytes) -> Route:
        decoder = self.connection.decoder
        generation = decoder.generation
        cached = self._routes.get(block)
        if cached is not None and cached[0] == generation:
            return cached[1]
        fields = decoder.decode(block)
        route = self._route_fields(fields)
        # replayable when decoding changed no table entry; small blocks only (grpc-go's are ~10 bytes),
        # so the cache holds kilobytes whatever a client sends
        if decoder.generation == generation and len(block) <= 256:
            if len(self._routes) >= 64:
                self._routes.clear()
            self._routes[block] = (generation, route)
        return route

    def _route_fields(self, fields: list[tuple[bytes, bytes]]) -> Route:
        try:
            request = parse_request(fields)
        except Malformed as malformed:
            return Route("", None, b"", None, str(malformed), 0, None)
        path, length = request.path, request.content_length
        if sum(len(name) + len(value) + 32 for name, value in fields) > MAX_HEADER_LIST:
            return Route(path, None, b"", length, "", 431, None)
        if request.method != b"POST":
            return Route(path, None, b"", length, "", 405, None)
        if not is_grpc_content_type(request.content_type):
            return Route(path, None, b"", length, "", 415, None)
        method = self.server.methods.get(path)
        if method is None:
            return Route(path, None, b"", length, "", 0, (StatusCode.UNIMPLEMENTED, f"Method not found: {path}"))
        return Route(path, method, request.encoding, length, "", 0, None)

    def check_trailers(self, fields: list[tuple[bytes, bytes]]) -> None:
        check_trailers(fields)

    def open(self, stream: Stream, route: Route) -> None:
        if route.malformed:
            raise Malformed(route.malformed)
        stream.content_length = route.content_length
        call = Call(route)
        stream.call = call
        if route.http_status:
            call.discard = True
        elif route.error is not None:
            if stream.remote_closed and route.content_length:  # the request is over: check it first
                raise Malformed(f"0 bytes of DATA where content-length says {route.content_length}")
            self.reject(stream, *route.error)

    def data(self, stream: Stream, data: bytes) -> int:
        """A DATA payload for `stream`; how many bytes were kept (buffered)."""
        call: Call = stream.call  # type: ignore[assignment]
        if call.discard:
            return 0
        call.body += data
        limit = self.connection.limits.max_message
        if len(call.body) > limit + 5:
            self.reject(stream, StatusCode.RESOURCE_EXHAUSTED,
                        f"Received message larger than max ({len(call.body) - 5} vs. {limit})")
            return 0
        return len(data)

    def end_of_request(self, stream: Stream, last: bytes) -> None:
        """The request is complete; `last` is its final DATA payload (b"" when none)."""
        call: Call = stream.call  # type: ignore[assignment]
        if call.http_status:
            self._answer_http(stream, call.http_status)
        elif not call.discard:
            body: bytes | bytearray = last  # a one-frame request: no copy (a frame is far below the limit)
            if call.body:  # earlier frames were held: one buffer
                body = call.body
                body += last
                call.body = bytearray()
                self.connection.release(stream)
                limit = self.connection.limits.max_message
                if len(body) > limit + 5:
                    self.reject(stream, StatusCode.RESOURCE_EXHAUSTED,
                                f"Received message larger than max ({len(body) - 5} vs. {limit})")
                    return
            self._call(stream, call, body)

    def _call(self, stream: Stream, call: Call, body: bytes | bytearray) -> None:
        connection = self.connection
        method = call.method
        assert method is not None
        if len(body) < 5:
            self.reject(stream, StatusCode.INTERNAL, "the request has no message")
            return
        compressed, length = struct.unpack_from(">BI", body)
        if compressed:
            if compressed != 1:
                self.reject(stream, StatusCode.INTERNAL, f"invalid compressed flag {compressed}")
            elif call.encoding in (b"", b"identity"):  # gRPC: the flag needs a grpc-encoding
                self.reject(stream, StatusCode.INTERNAL, "compressed flag set with identity or empty encoding")
            else:
                self.reject(stream, StatusCode.UNIMPLEMENTED,
                            f"grpc-encoding {call.encoding.decode('latin-1')[:40]} is not supported; send identity",
                            ((b"grpc-accept-encoding", b"identity"),))
            return
        if length != len(body) - 5:
            self.reject(stream, StatusCode.INTERNAL, "a unary request must carry exactly one message")
            return
        request_log = self.server.request_log
        try:
            request = method.request_class.FromString(bytes(body[5:]))
        except Exception as exc:  # protobuf's DecodeError differs between runtimes
            request_log.warning("could not deserialize a %s request: %s", call.path, exc)
            self.reject(stream, StatusCode.INTERNAL, "Exception deserializing request!")
            return
        try:
            result = method.handler(request, CallContext(call.path, connection))
        except RpcFailure as failure:
            self.reject(stream, failure.code, failure.details)
            return
        except Exception as exc:
            request_log.error("%s failed: %s: %s", call.path, type(exc).__name__, exc)
            self.reject(stream, StatusCode.UNKNOWN, f"Exception calling application: {exc}")
            return
        if not method.streaming:
            self._answer(stream, result.SerializeToString())
            return
        call.watch = result
        self.server.watching.add((connection, stream))
        self.poll(stream)

    def _answer(self, stream: Stream, message: bytes) -> None:
        """A unary call's answer: headers, message and trailers in one write when the windows allow
        (they nearly always do), else through the flow-controlled path."""
        connection = self.connection
        limit = connection.limits.max_answer
        if len(message) > limit:
            self.server.request_log.warning("%s: refused to send a %d-byte answer (above %d)",
                                            stream.call.path, len(message), limit)  # type: ignore[attr-defined]
            self.reject(stream, StatusCode.RESOURCE_EXHAUSTED,
                        f"the answer is {len(message)} bytes, above the {limit}-byte limit; ask for less per call")
            return
        length = len(message) + 5
        if length <= connection.send_window and length <= stream.send_window and length <= connection.peer_max_frame \
                and not connection.table_update and len(connection.out) < connection.limits.out_limit:
            sid = stream.id
            out = connection.out
            out += _ANSWER_HEAD.pack(0, len(RESPONSE_HEADERS), h2.HEADERS, h2.END_HEADERS, sid, RESPONSE_HEADERS,
                                     length >> 8, length & 0xFF, h2.DATA, 0, sid, 0, len(message))
            out += message
            out += _ANSWER_TAIL.pack(0, len(OK_TRAILERS), h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid,
                                     OK_TRAILERS)
            connection.send_window -= length
            stream.send_window -= length
            stream.headers_sent = True
            stream.final = None
            connection.finished(stream)
            return
        connection.start_response(stream, RESPONSE_HEADERS)
        stream.final = OK_TRAILERS
        connection.send(stream, h2.grpc_message(message))

    def _answer_http(self, stream: Stream, status: int) -> None:
        """A request that is not gRPC: an HTTP status and a line of text (gRPC's PROTOCOL-HTTP2: 415 for
        another content type; 405 for another method, as grpc-go answers; 431 for headers too large)."""
        connection = self.connection
        reason = {405: "gRPC requests use POST", 415: "gRPC requests have content-type application/grpc",
                  431: f"request header fields above {MAX_HEADER_LIST} bytes"}[status]
        body = f"{status}: this is a gRPC server (kubelet device plugin API); {reason}\n".encode()
        connection.start_response(stream, h2.header_block([
            (b":status", str(status).encode()), (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode())]))
        stream.final, stream.final_is_data = b"", True
        connection.send(stream, body)

    # ------------------------------------------------------------ streams of answers

    def poll(self, stream: Stream) -> None:
        call: Call = stream.call  # type: ignore[assignment]
        watch = call.watch
        if watch is None:
            return
        try:
            messages, done = watch.poll()
        except Exception as exc:
            self.server.request_log.error("%s failed: %s: %s", call.path, type(exc).__name__, exc)
            self.end_watch_with(stream, StatusCode.UNKNOWN, f"Exception iterating responses: {exc}")
            return
        if messages:
            call.queued = messages[-1]  # full snapshots: the newest supersedes any unsent one
        if done:
            self._end_watch(call, stream)
            stream.final = OK_TRAILERS
        self.connection.push(stream)

    def has_queued(self, stream: Stream) -> bool:
        call = stream.call
        return call is not None and call.queued is not None  # type: ignore[attr-defined]

    def next_message(self, stream: Stream) -> bytes | None:
        """The stream's next message once the previous one is out: the newest queued snapshot."""
        call: Call | None = stream.call  # type: ignore[assignment]
        if call is None or call.queued is None:
            return None
        message, call.queued = call.queued, None
        self.connection.start_response(stream, RESPONSE_HEADERS)
        return self.server.encoded.get(message)

    def end_watch_with(self, stream: Stream, code: StatusCode, details: str) -> None:
        call: Call = stream.call  # type: ignore[assignment]
        self._end_watch(call, stream)
        call.queued = None
        if stream.headers_sent or stream.unsent:
            stream.final = error_trailers(code, details)
        else:
            stream.headers_sent = True
            stream.final = trailers_only(code, details)
        self.connection.push(stream)

    def reject(self, stream: Stream, code: StatusCode, details: str,
               extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """End a call with an error status; the rest of its request (if any) is dropped."""
        call: Call = stream.call  # type: ignore[assignment]
        call.discard = True
        call.body = bytearray()
        self.connection.release(stream)
        if stream.headers_sent:
            stream.final = error_trailers(code, details)
        else:
            stream.headers_sent = True
            stream.final = trailers_only(code, details, extra)
        self.connection.push(stream)

    def closed(self, stream: Stream) -> None:
        """The stream ended, however: its watch ends, its buffers go."""
        call: Call = stream.call  # type: ignore[assignment]
        if call.watch is not None:
            self._end_watch(call, stream)
        call.queued = None
        call.body = bytearray()

    def _end_watch(self, call: Call, stream: Stream) -> None:
        watch, call.watch = call.watch, None
        if watch is None:
            return
        self.server.watching.discard((self.connection, stream))
        try:
            watch.close()
        except Exception:
            self.server.request_log.exception("closing a stream failed")
