"""The candidate that issue 36 weighs against our own framing: python-hyper's `h2` (its state
machine, flow control and framing) under our epoll loop and our gRPC layer (the same `Method`,
`Watch`, `CallContext` and handlers), with the same public shape as api.grpc_server.Server.

Bench-only: nothing in the plugin imports it. Run the plugin on it with
    PYTHONPATH=plugin/src:<dir with h2 and hyperframe> python bench/h2lib_candidate.py [plugin flags]
(kubelet_bench.py's `--h2lib DIR` does that as a target of its own). It does what the kubelet's
calls need (unary and server-streaming calls, flow control both ways, errors as h2 raises them)
and no more: it is the measuring stick for the choice, bench/README.md has the figures.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import struct
import sys
import threading
from collections.abc import Mapping
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from gpu_device_plugin.api.grpc_server import CallContext, Method
from gpu_device_plugin.api.status import RpcFailure, StatusCode, encode_message

log = logging.getLogger(__name__)
MAX_MESSAGE = 4 * 1024 * 1024
_WINDOW = MAX_MESSAGE + 5 + 16384
_READ, _WRITE = select.EPOLLIN, select.EPOLLOUT
_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class _Call:
    __slots__ = ("id", "method", "path", "body", "watch", "pending", "queued", "trailers", "headers_sent", "plain")

    def __init__(self, stream_id: int) -> None:
        self.id = stream_id
        self.method: Method | None = None
        self.path = ""
        self.body = bytearray()
        self.watch: Any = None
        self.pending = b""
        self.queued: Any = None
        self.trailers: list[tuple[bytes, bytes]] | None = None
        self.headers_sent = False
        self.plain = False  # not gRPC: a line of text ended by an empty DATA frame, no trailers


class _Connection:
    def __init__(self, server: H2LibServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.fd = sock.fileno()
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config)
        self.h2.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 16384,
            h2.settings.SettingCodes.ENABLE_PUSH: 0})
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(_WINDOW - 65535)
        self.calls: dict[int, _Call] = {}
        self.closed = False
        self.out = bytearray()

    def on_readable(self) -> None:
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        try:
            for event in self.h2.receive_data(data):
                self._event(event)
        except h2.exceptions.ProtocolError as error:  # h2 queued the GOAWAY: send it, then close
            self.out += self.h2.data_to_send()
            self.flush()
            log.debug("closing a connection: %s", error)
            self.close()
            return
        except h2.exceptions.H2Error as error:  # a state our glue did not expect: this connection only
            log.debug("closing a connection: %s", error)
            self.close()
            return
        self.flush()

    def _event(self, event: Any) -> None:
        if isinstance(event, h2.events.RequestReceived):
            call = _Call(event.stream_id)
            self.calls[event.stream_id] = call
            fields = dict(event.headers)
            call.path = fields.get(b":path", b"").decode("latin-1")
            grpc = fields.get(b"content-type", b"").startswith(b"application/grpc")
            if fields.get(b":method") != b"POST" or not grpc:  # as ours: a status and a line of text
                status = b"405" if fields.get(b":method") != b"POST" else b"415"
                self.h2.send_headers(event.stream_id, [(b":status", status), (b"content-type", b"text/plain")])
                call.headers_sent = call.plain = True
                call.pending = b"this is a gRPC server\n"
                self._push(call)
                return
            call.method = self.server.methods.get(call.path)
            if call.method is None:
                self._finish(call, StatusCode.UNIMPLEMENTED, f"Method not found: {call.path}")
        elif isinstance(event, h2.events.DataReceived):
            call = self.calls.get(event.stream_id)
            if call is not None and call.method is not None:
                call.body += event.data
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            call = self.calls.get(event.stream_id)
            if call is not None and call.method is not None and not call.plain:
                self._call(call)
        elif isinstance(event, h2.events.StreamReset):
            self._drop(event.stream_id)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            for call in list(self.calls.values()):
                self._push(call)
        elif isinstance(event, h2.events.ConnectionTerminated):
            for stream_id in list(self.calls):
                self._drop(stream_id)

    def _call(self, call: _Call) -> None:
        method = call.method
        assert method is not None
        body = call.body
        if len(body) < 5 or body[0] or struct.unpack_from(">I", body, 1)[0] != len(body) - 5:
            self._finish(call, StatusCode.INTERNAL, "a unary request must carry exactly one uncompressed message")
            return
        try:
            request = method.request_class.FromString(bytes(body[5:]))
            result = method.handler(request, CallContext(call.path))
        except RpcFailure as failure:
            self._finish(call, failure.code, failure.details)
            return
        except Exception as exc:
            self._finish(call, StatusCode.UNKNOWN, f"Exception calling application: {exc}")
            return
        if not method.streaming:
            call.queued = result
            call.trailers = [(b"grpc-status", b"0")]
            self._push(call)
            return
        call.watch = result
        self.server.watching.add((self, call))
        self.poll(call)

    def poll(self, call: _Call) -> None:
        if call.watch is None:
            return
        try:
            messages, done = call.watch.poll()
        except Exception as exc:
            self._end_watch(call)
            self._finish(call, StatusCode.UNKNOWN, f"Exception iterating responses: {exc}")
            return
        if messages:
            call.queued = messages[-1]
        if done:
            self._end_watch(call)
            call.trailers = [(b"grpc-status", b"0")]
        self._push(call)

    def _finish(self, call: _Call, code: StatusCode, details: str) -> None:
        call.trailers = [(b"grpc-status", str(int(code)).encode()), (b"grpc-message", encode_message(details))]
        self._push(call)

    def _push(self, call: _Call) -> None:
        connection = self.h2
        sid = call.id
        try:
            while True:
                if not call.pending and call.queued is not None:
                    message = call.queued.SerializeToString()
                    call.queued = None
                    call.pending = struct.pack(">BI", 0, len(message)) + message
                if not call.pending:
                    break
                if not call.headers_sent:
                    connection.send_headers(sid, _RESPONSE_HEADERS)
                    call.headers_sent = True
                allowed = min(connection.local_flow_control_window(sid), connection.max_outbound_frame_size,
                              len(call.pending))
                if allowed <= 0:
                    return
                connection.send_data(sid, call.pending[:allowed])
                call.pending = call.pending[allowed:]
            if call.plain:
                connection.send_data(sid, b"", end_stream=True)
                self.calls.pop(sid, None)
            elif call.trailers is not None:
                if call.headers_sent:
                    connection.send_headers(sid, call.trailers, end_stream=True)
                else:
                    connection.send_headers(sid, [*_RESPONSE_HEADERS, *call.trailers], end_stream=True)
                self.calls.pop(sid, None)
        except h2.exceptions.StreamClosedError:
            self._drop(sid)

    def _end_watch(self, call: _Call) -> None:
        watch, call.watch = call.watch, None
        if watch is not None:
            self.server.watching.discard((self, call))
            with contextlib.suppress(Exception):
                watch.close()

    def _drop(self, stream_id: int) -> None:
        call = self.calls.pop(stream_id, None)
        if call is not None:
            self._end_watch(call)

    def flush(self) -> None:
        self.out += self.h2.data_to_send()
        while self.out and not self.closed:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                return
            del self.out[:sent]
        if not self.closed:
            self.server.set_interest(self, _READ | (_WRITE if self.out else 0))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for stream_id in list(self.calls):
            self._drop(stream_id)
        self.server.forget(self)
        with contextlib.suppress(OSError):
            self.sock.close()


class H2LibServer:
    """api.grpc_server.Server's public shape (bind, start, wake, stop, stopped) on python-hyper's h2."""

    def __init__(self, methods: Mapping[str, Method], request_log: logging.Logger | None = None) -> None:
        self.methods = dict(methods)
        self.watching: set[tuple[_Connection, _Call]] = set()
        self._epoll = select.epoll()
        self._connections: dict[int, _Connection] = {}
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.stopped = threading.Event()

    def bind(self, path: str) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        listener.bind(path)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener

    def start(self) -> None:
        assert self._listener is not None
        self._epoll.register(self._listener.fileno(), _READ)
        self._epoll.register(self._wake_r, _READ)
        self._thread = threading.Thread(target=self._run, name="grpc-server", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        assert self._listener is not None
        listener = self._listener.fileno()
        try:
            while not self._stopping:
                for fd, mask in self._epoll.poll():
                    connection = self._connections.get(fd)
                    if connection is not None:
                        if mask & ~_WRITE:
                            connection.on_readable()
                        if mask & _WRITE and not connection.closed:
                            connection.flush()
                    elif fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                        for connection, call in list(self.watching):
                            connection.poll(call)
                            connection.flush()
                    elif fd == listener:
                        self._accept()
        finally:
            for connection in list(self._connections.values()):
                connection.close()
            self._listener.close()
            self._epoll.close()
            self.stopped.set()

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

    def forget(self, connection: _Connection) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(connection.fd)
        self._connections.pop(connection.fd, None)


def main() -> int:
    from gpu_device_plugin.cli.main import main as plugin_main
    from gpu_device_plugin.service import server

    server.Server = H2LibServer  # type: ignore[assignment,misc]
    return plugin_main()


if __name__ == "__main__":
    sys.exit(main())
