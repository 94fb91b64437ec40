"""A gRPC server for the device plugin API: one thread, one epoll loop, HTTP/2 on a Unix socket.

Why not grpcio's server: it hands every call from its completion-queue thread to a pool
worker and back, several thread switches per call; measured with a Go client (the
kubelet's grpc-go) that cost ~0.28 ms of CPU per call where a Go server spends ~0.07 ms
(bench/kubelet_bench.py). Here a call is read, handled and answered in one pass of the
loop, with one write. Handlers are short (the policy core), so they run on the loop.

Server streaming (ListAndWatch) holds no thread: a stream handler returns a `Watch` that
the loop polls whenever `wake()` is called (the device state changed) and that says what to
send and whether the stream is over. So open streams can never starve unary calls.

Supported: unary and server-streaming calls, identity encoding (uncompressed; what the
kubelet and grpcio send by default), flow control both ways, PING, GOAWAY, RST_STREAM,
CONTINUATION, HPACK (the hpack library, via h2.py). Deadlines are not enforced on our side (handlers take
microseconds); the client enforces its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from . import h2
from .status import RpcFailure, StatusCode, encode_message

log = logging.getLogger(__name__)

MAX_MESSAGE = 4 * 1024 * 1024  # gRPC's default receive limit
MAX_STREAMS_PER_CONNECTION = 100
RECEIVE_WINDOW = 16 * 1024 * 1024  # connection and stream; replenished per connection
_READ_SIZE = 64 * 1024
_READ, _WRITE = select.EPOLLIN, select.EPOLLOUT

_OUR_SETTINGS = h2.settings({
    h2.MAX_CONCURRENT_STREAMS: MAX_STREAMS_PER_CONNECTION,
    h2.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW,
    h2.MAX_HEADER_LIST_SIZE: 65536,
}) + h2.window_update(0, RECEIVE_WINDOW - h2.DEFAULT_WINDOW)
_RESPONSE_HEADERS = h2.header_block([(b":status", b"200"), (b"content-type", b"application/grpc")])
_OK_TRAILERS = h2.header_block([(b"grpc-status", b"0")])


class Watch(Protocol):
    """What a server-streaming handler returns; the loop calls it, never another thread."""

    def poll(self) -> tuple[list[Any], bool]:
        """Messages to send now, and whether the stream is over (ends with status OK)."""
        ...

    def close(self) -> None:
        """The stream ended, however (finished, cancelled, connection gone, server stopped)."""
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


def _trailers_only(code: StatusCode, details: str) -> bytes:
    fields = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", str(int(code)).encode())]
    if details:
        fields.append((b"grpc-message", encode_message(details)))
    return h2.header_block(fields)


def _error_trailers(code: StatusCode, details: str) -> bytes:
    fields = [(b"grpc-status", str(int(code)).encode())]
    if details:
        fields.append((b"grpc-message", encode_message(details)))
    return h2.header_block(fields)


class _Stream:
    __slots__ = ("id", "method", "path", "body", "send_window", "pending", "trailers", "headers_sent", "watch",
                 "remote_closed", "rejected")

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.method: Method | None = None
        self.path = ""
        self.body = bytearray()
        self.send_window = send_window
        self.pending = bytearray()  # DATA payload waiting for flow-control window
        self.trailers: bytes | None = None  # the closing HEADERS frame, sent after `pending`
        self.headers_sent = False
        self.watch: Watch | None = None
        self.remote_closed = False
        self.rejected = False  # answered already (an error); later DATA is dropped


class _Connection:
    def __init__(self, server: Server, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.inbuf = bytearray()
        self.out = bytearray()
        self.preface_seen = False
        self.decoder = h2.HeaderDecoder()
        self.peer_max_frame = h2.DEFAULT_MAX_FRAME
        self.peer_initial_window = h2.DEFAULT_WINDOW
        self.send_window = h2.DEFAULT_WINDOW
        self.received = 0  # bytes of DATA taken since our last connection WINDOW_UPDATE
        self.streams: dict[int, _Stream] = {}
        self.last_stream_id = 0
        self.continuation: tuple[int, int, bytearray] | None = None  # stream, flags, header block so far
        self.going_away = False
        self.closed = False
        self.write_wanted = False
        # header block -> (table generation, path, method, error): a client such as grpc-go sends the same
        # fully indexed block for every call of a method, so decoding and routing it once is enough
        self._routes: dict[bytes, tuple[int, str, Method | None, tuple[StatusCode, str] | None]] = {}
        self.out += _OUR_SETTINGS

    # ------------------------------------------------------------ input

    def on_readable(self) -> None:
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
        try:
            self._parse()
        except h2.ProtocolError as error:
            log.debug("closing a client connection: %s", error)
            self.out += h2.goaway(self.last_stream_id, error.code, str(error).encode()[:200])
            self.flush()
            self.close()

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
        while size - pos >= 9 and not self.closed:
            length, kind, flags, stream_id = h2.parse_header(buf, pos)
            if length > h2.DEFAULT_MAX_FRAME:
                raise h2.ProtocolError(f"a {length}-byte frame is above our maximum", h2.FRAME_SIZE_ERROR)
            if size - pos - 9 < length:
                break
            payload = bytes(buf[pos + 9:pos + 9 + length])
            pos += 9 + length
            self._frame(kind, flags, stream_id, payload)
        del buf[:pos]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuation is not None and kind != h2.CONTINUATION:
            raise h2.ProtocolError("expected CONTINUATION")
        if kind == h2.DATA:
            self._data(flags, stream_id, payload)
        elif kind == h2.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == h2.CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == h2.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == h2.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == h2.PING:
            if len(payload) != 8 or stream_id:
                raise h2.ProtocolError("malformed PING", h2.FRAME_SIZE_ERROR)
            if not flags & h2.ACK:
                self.out += h2.frame(h2.PING, h2.ACK, 0, payload)
        elif kind == h2.RST_STREAM:
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self._end_watch(stream)
        elif kind == h2.GOAWAY:
            self.going_away = True
        elif kind == h2.PUSH_PROMISE:
            raise h2.ProtocolError("a client must not push")
        # PRIORITY and unknown frame types are ignored, as HTTP/2 requires

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise h2.ProtocolError("SETTINGS on a stream")
        if flags & h2.ACK:
            return
        values = h2.parse_settings(payload)
        if h2.MAX_FRAME_SIZE in values:
            if not h2.DEFAULT_MAX_FRAME <= values[h2.MAX_FRAME_SIZE] <= (1 << 24) - 1:
                raise h2.ProtocolError("invalid SETTINGS_MAX_FRAME_SIZE")
            self.peer_max_frame = values[h2.MAX_FRAME_SIZE]
        if h2.INITIAL_WINDOW_SIZE in values:
            window = values[h2.INITIAL_WINDOW_SIZE]
            if window > h2.MAX_WINDOW:
                raise h2.ProtocolError("invalid SETTINGS_INITIAL_WINDOW_SIZE", h2.FLOW_CONTROL_ERROR)
            delta = window - self.peer_initial_window
            self.peer_initial_window = window
            for stream in self.streams.values():
                stream.send_window += delta
        self.out += h2.frame(h2.SETTINGS, h2.ACK, 0)
        self._push_all()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        increment = h2.u32(payload)
        if stream_id == 0:
            self.send_window += increment
            if self.send_window > h2.MAX_WINDOW:
                raise h2.ProtocolError("connection window overflow", h2.FLOW_CONTROL_ERROR)
            self._push_all()
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.send_window += increment
            self._push(stream)

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise h2.ProtocolError("HEADERS on stream 0")
        block = h2.unpadded(payload, flags)
        if flags & h2.PRIORITY_FLAG:
            block = block[5:]
        if flags & h2.END_HEADERS:
            self._header_block(stream_id, flags, block)
        else:
            self.continuation = (stream_id, flags, bytearray(block))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuation is None or self.continuation[0] != stream_id:
            raise h2.ProtocolError("CONTINUATION without HEADERS")
        block = self.continuation[2]
        block += payload
        if len(block) > 256 * 1024:
            raise h2.ProtocolError("header block too large", h2.COMPRESSION_ERROR)
        if flags & h2.END_HEADERS:
            first_flags = self.continuation[1]
            self.continuation = None
            self._header_block(stream_id, first_flags, bytes(block))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client: the request is complete
            self.decoder.decode(block)  # always: the dynamic table must stay in step
            if flags & h2.END_STREAM:
                self._request_complete(stream)
            return
        generation = self.decoder.generation
        route = self._routes.get(block)
        if route is None or route[0] != generation:
            route = (generation, *self._route(self.decoder.decode(block)))
            if self.decoder.generation == generation:  # decoding changed no table entry: replayable
                if len(self._routes) >= 64:
                    self._routes.clear()
                self._routes[block] = route
        if stream_id % 2 == 0 or stream_id <= self.last_stream_id:
            if stream_id <= self.last_stream_id and stream_id % 2:
                return  # a stream we already closed (e.g. after an error answer): drop it
            raise h2.ProtocolError(f"invalid new stream id {stream_id}")
        self.last_stream_id = stream_id
        if self.going_away or len(self.streams) >= MAX_STREAMS_PER_CONNECTION:
            self.out += h2.rst_stream(stream_id, h2.REFUSED_STREAM)
            return
        stream = _Stream(stream_id, self.peer_initial_window)
        self.streams[stream_id] = stream
        _, stream.path, stream.method, error = route
        if error is not None:
            self._reject(stream, *error)
        if flags & h2.END_STREAM:
            self._request_complete(stream)

    def _route(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, Method | None, tuple[StatusCode, str] | None]:
        fields = dict(headers)
        path = fields.get(b":path", b"").decode("latin-1")
        method = self.server.methods.get(path)
        if fields.get(b":method") != b"POST" or not fields.get(b"content-type", b"").startswith(b"application/grpc"):
            return path, None, (StatusCode.INTERNAL, "not a gRPC request (POST, content-type application/grpc)")
        if method is None:
            return path, None, (StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
        return path, method, None

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self.received += len(payload)
        if self.received > RECEIVE_WINDOW:
            raise h2.ProtocolError("the client overran our connection window", h2.FLOW_CONTROL_ERROR)
        if self.received >= RECEIVE_WINDOW // 2:
            self.out += h2.window_update(0, self.received)
            self.received = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self.last_stream_id or stream_id == 0:
                raise h2.ProtocolError("DATA on an idle stream")
            return  # a stream we closed or refused: its late data is dropped
        if not stream.rejected:
            stream.body += h2.unpadded(payload, flags)
            if len(stream.body) > MAX_MESSAGE + 5:
                self._reject(stream, StatusCode.RESOURCE_EXHAUSTED,
                             f"Received message larger than max ({len(stream.body) - 5} vs. {MAX_MESSAGE})")
        if flags & h2.END_STREAM:
            self._request_complete(stream)

    # ------------------------------------------------------------ calls

    def _request_complete(self, stream: _Stream) -> None:
        stream.remote_closed = True
        if stream.rejected:
            self._forget_if_done(stream)
            return
        method = stream.method
        assert method is not None
        body = stream.body
        stream.body = bytearray()
        if len(body) < 5:
            self._reject(stream, StatusCode.INTERNAL, "the request has no message")
            return
        compressed, length = struct.unpack_from(">BI", body)
        if compressed:
            self._reject(stream, StatusCode.UNIMPLEMENTED, "compressed messages are not supported; send identity")
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
        if length <= self.send_window and length <= stream.send_window and length <= self.peer_max_frame:
            sid = stream.id
            self.out += b"".join((
                h2.frame(h2.HEADERS, h2.END_HEADERS, sid, _RESPONSE_HEADERS),
                h2.frame(h2.DATA, 0, sid, struct.pack(">BI", 0, len(message)) + message),
                h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, _OK_TRAILERS)))
            self.send_window -= length
            del self.streams[sid]  # the request ended before we answered: nothing more on this stream
            return
        if not stream.headers_sent:
            self.out += h2.frame(h2.HEADERS, h2.END_HEADERS, stream.id, _RESPONSE_HEADERS)
            stream.headers_sent = True
        stream.pending += h2.grpc_message(message)
        self._finish(stream, _OK_TRAILERS)

    def send_watch_messages(self, stream: _Stream, messages: list[Any], done: bool) -> None:
        for message in messages:
            self._send_message(stream, message)
        if done:
            self._end_watch(stream)
            self._finish(stream, _OK_TRAILERS)

    def end_watch_with(self, stream: _Stream, code: StatusCode, details: str) -> None:
        self._end_watch(stream)
        self._finish(stream, _error_trailers(code, details) if stream.headers_sent else _trailers_only(code, details))

    def _send_message(self, stream: _Stream, message: Any) -> None:
        if not stream.headers_sent:
            self.out += h2.frame(h2.HEADERS, h2.END_HEADERS, stream.id, _RESPONSE_HEADERS)
            stream.headers_sent = True
        stream.pending += h2.grpc_message(message.SerializeToString())
        self._push(stream)

    def _reject(self, stream: _Stream, code: StatusCode, details: str) -> None:
        stream.rejected = True
        if stream.headers_sent:
            self._finish(stream, _error_trailers(code, details))
        else:
            stream.headers_sent = True
            self._finish(stream, _trailers_only(code, details))
        if not stream.remote_closed:  # tell the client to stop sending the rest of its request
            self.out += h2.rst_stream(stream.id, h2.NO_ERROR)
            stream.remote_closed = True
            self._forget_if_done(stream)

    def _finish(self, stream: _Stream, block: bytes) -> None:
        stream.trailers = h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream.id, block)
        self._push(stream)

    def _push(self, stream: _Stream) -> None:
        """Send what flow control allows of the stream's data, then its trailers once all is out."""
        pending = stream.pending
        while pending:
            allowed = min(self.send_window, stream.send_window, self.peer_max_frame, len(pending))
            if allowed <= 0:
                return
            self.out += h2.frame(h2.DATA, 0, stream.id, bytes(pending[:allowed]))
            del pending[:allowed]
            self.send_window -= allowed
            stream.send_window -= allowed
        if stream.trailers is not None:
            self.out += stream.trailers
            stream.trailers = b""
            self._forget_if_done(stream)

    def _push_all(self) -> None:
        for stream in list(self.streams.values()):
            if stream.pending or stream.trailers:
                self._push(stream)

    def _forget_if_done(self, stream: _Stream) -> None:
        if stream.remote_closed and stream.trailers == b"":
            self.streams.pop(stream.id, None)

    def _end_watch(self, stream: _Stream) -> None:
        watch, stream.watch = stream.watch, None
        if watch is not None:
            self.server.watching.discard((self, stream))
            try:
                watch.close()
            except Exception:
                log.exception("closing a stream failed")

    # ------------------------------------------------------------ output and teardown

    def flush(self) -> None:
        """Write what is queued; what the socket does not take now waits for EVENT_WRITE."""
        while self.out and not self.closed:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                return
            del self.out[:sent]
        if not self.closed and self.write_wanted != bool(self.out):
            self.write_wanted = bool(self.out)
            self.server.want_write(self, self.write_wanted)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for stream in list(self.streams.values()):
            self._end_watch(stream)
        self.streams.clear()
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
                for fd, mask in self._epoll.poll():
                    connection = connections.get(fd)
                    if connection is not None:
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
                for connection in list(self._connections.values()):
                    if connection.out:
                        connection.flush()
                    if connection.going_away and not connection.streams:
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
            self._connections[sock.fileno()] = connection
            self._epoll.register(sock.fileno(), _READ)
            connection.flush()

    def want_write(self, connection: _Connection, wanted: bool) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._epoll.modify(connection.sock.fileno(), _READ | (_WRITE if wanted else 0))

    def forget(self, connection: _Connection) -> None:
        fd = connection.sock.fileno()
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(fd)
        self._connections.pop(fd, None)

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _close_all(self) -> None:
        for connection in list(self._connections.values()):
            for stream in list(connection.streams.values()):
                self.poll_watch(connection, stream)  # a servicer that stopped ends its streams with OK
                if stream.watch is not None:  # one it did not end: the server is going away
                    connection.end_watch_with(stream, StatusCode.UNAVAILABLE, "the device plugin is stopping")
            connection.out += h2.goaway(connection.last_stream_id, h2.NO_ERROR)
            _flush_blocking(connection)
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


def _flush_blocking(connection: _Connection, timeout: float = 0.2) -> None:
    """Last words before closing (trailers, GOAWAY): a short blocking write, never a hang."""
    if connection.closed or not connection.out:
        return
    with contextlib.suppress(OSError):
        connection.sock.settimeout(timeout)
        connection.sock.sendall(connection.out)
    connection.out.clear()
