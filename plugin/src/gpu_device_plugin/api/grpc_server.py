"""A gRPC server for the device plugin API: one thread, one epoll loop, HTTP/2 on Unix sockets.

Why not grpcio's server: it hands every call from its completion-queue thread to a pool
worker and back, several thread switches per call; measured with a Go client (the
kubelet's grpc-go) that cost ~0.28 ms of CPU per call where a Go server spends ~0.07 ms
(bench/kubelet_bench.py). Here a call is read, handled and answered in one pass of the
loop, with one write. Handlers are short (the policy core), so they run on the loop. Why not
python-hyper's h2 under this loop: measured, 3x the admission time (bench/README.md).

The parts, one concern each: `h2.py` frames, `flow.py` flow control, `streams.py` the stream
state machine (RFC 9113 5.1), `connection.py` one HTTP/2 connection, `grpc_calls.py` gRPC on it,
`limits.py` every cap. This module is the loop: sockets, readiness, fairness, budgets and
timers across connections.

Live and bounded whatever peers do (`limits.Limits` says how much): each turn of the loop
serves the kubelet's connection first (a handler marks it: `CallContext.serve_first`), then
every other connection with input, each for at most `frames_per_turn` frames, so no peer's
frames starve another's. Request credit goes back as DATA arrives while the bytes buffered
across all connections stay under `max_buffered` (past it, only the oldest waiting stream gets
more, so every request still completes); connections, streams, output and unary answers are
capped; idle and stalled connections are closed; out of file descriptors, accepting pauses
and resumes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Mapping

from . import h2
from .connection import Connection
from .grpc_calls import CallContext, Calls, Encoded, Method, Watch
from .limits import DEFAULT, MAX_HEADER_LIST, Limits
from .status import StatusCode
from .streams import Stream

__all__ = ["CallContext", "Method", "Server", "Watch"]

# the defaults under their earlier names (limits.Limits holds them all)
MAX_MESSAGE = DEFAULT.max_message
MAX_STREAMS_PER_CONNECTION = DEFAULT.max_streams_per_connection
OUT_LIMIT = DEFAULT.out_limit

log = logging.getLogger(__name__)

_READ, _WRITE = select.EPOLLIN, select.EPOLLOUT
_HANGUP = select.EPOLLHUP | select.EPOLLERR
_READ_AHEAD = 2 * h2.DEFAULT_MAX_FRAME  # unparsed input past this: the socket is not read until it is parsed
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _settings_frame(limits: Limits) -> bytes:
    return h2.settings({
        h2.ENABLE_PUSH: 0,
        h2.MAX_CONCURRENT_STREAMS: limits.max_streams_per_connection,
        h2.INITIAL_WINDOW_SIZE: limits.stream_window,
        h2.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
    }) + h2.window_update(0, limits.connection_window - h2.DEFAULT_WINDOW)


class Server:
    """Serve `methods` (path -> Method) on one or more Unix sockets from one thread."""

    def __init__(self, methods: Mapping[str, Method], request_log: logging.Logger | None = None,
                 limits: Limits = DEFAULT) -> None:
        self.methods = dict(methods)
        self.request_log = request_log or log
        self.limits = limits
        self.settings_frame = _settings_frame(limits)
        self.watching: set[tuple[Connection, Stream]] = set()
        self.encoded = Encoded()
        self.open_streams = 0  # across all connections
        self.buffered = 0  # request bytes buffered across all connections
        self.serial = 0  # streams opened so far, all connections: a stream's number says how old it is
        self._waiting: dict[tuple[Connection, int], Stream] = {}  # streams owed credit the budget held back
        self._epoll = select.epoll()
        self._connections: dict[int, Connection] = {}  # by file descriptor, oldest first
        self._closing: dict[Connection, float] = {}  # connections ended by an error -> when to drop them
        self._listeners: list[socket.socket] = []
        self._accept_paused_until = 0.0  # out of file descriptors: listeners off until then (0: on)
        self._accept_failing = False  # an episode of failed accepts is going on (logged once)
        self._carry: list[Connection] = []  # connections to serve next turn at once (frames left, answers to push)
        self._peak = 0  # the most bytes buffered and queued since memory was last handed back
        self._queued = 0  # output queued across all connections, as of the end of the last turn
        self._preferred = 0  # connections marked the kubelet's
        self._next_sweep = 0.0  # when idle and stalled connections are looked for next
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._woken = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.stopped = threading.Event()

    def bind(self, path: str) -> None:
        """Listen on `path` too (a server may serve several sockets); before start()."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.bind(path)
            listener.listen(64)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self._listeners.append(listener)

    def start(self) -> None:
        assert self._listeners, "bind() first"
        for listener in self._listeners:
            self._epoll.register(listener.fileno(), _READ)
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
        """End every stream and connection, close the listeners; returns once the loop has left."""
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._close_all()

    # ------------------------------------------------------------ what connections ask of the server

    def may_open_stream(self, connection: Connection) -> bool:
        """A new stream on `connection`: within its own cap, not while answers it has not taken fill
        its output cap, and within the total unless it is the kubelet's or its only one (so a new
        connection, the kubelet's among them, is always answered)."""
        if len(connection.streams) >= self.limits.max_streams_per_connection:
            return False
        if connection.held >= self.limits.out_limit and not connection.preferred:
            return False  # answers wait for its window already: no new call until they drain
        return connection.preferred or not connection.streams or self.open_streams < self.limits.max_streams

    def grant(self, connection: Connection, stream: Stream, length: int) -> None:
        """`length` bytes of `stream`'s window are owed back: sent now, or once the budget allows."""
        if length <= 0 or stream.remote_closed:
            return
        stream.owed += length
        if stream.owed < self.limits.stream_window // 2:
            return  # a WINDOW_UPDATE per half window, not per frame
        if connection.preferred or self.buffered <= self.limits.max_buffered:
            connection.give_stream_credit(stream, stream.owed)
        else:
            self._waiting[(connection, stream.id)] = stream

    def prefer(self, connection: Connection) -> None:
        if not connection.preferred:
            connection.preferred = True
            self._preferred += 1
            log.debug("connection %d is the kubelet's: served first", connection.fd)

    def closing_at(self, connection: Connection, deadline: float) -> None:
        self._closing[connection] = deadline

    def forget(self, connection: Connection) -> None:
        self._queued -= connection.counted
        connection.counted = 0
        if connection.preferred and self._connections.get(connection.fd) is connection:
            self._preferred -= 1
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(connection.fd)
        self._connections.pop(connection.fd, None)
        self._closing.pop(connection, None)
        for key in [key for key in self._waiting if key[0] is connection]:
            del self._waiting[key]
        if self._accept_paused_until:
            self._resume_accepting()  # a descriptor came free

    # ------------------------------------------------------------ loop (server thread only)

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._turn()
        except Exception:
            log.exception("the gRPC server loop failed")
        finally:
            self._close_all()

    def _turn(self) -> None:
        connections = self._connections
        if self._carry or self._closing or self._accept_paused_until or len(connections) != self._preferred:
            timeout = self._timeout()
        else:
            timeout = -1.0  # only the kubelet's connections: no timer (an idle plugin sleeps in epoll)
        touched = self._carry  # connections with frames left, or answers to push, from the last turn
        self._carry = []
        for fd, mask in self._epoll.poll(timeout):
            connection = connections.get(fd)
            if connection is None:
                if fd == self._wake_r:
                    self._drain_wake()
                    self._woken = True
                else:
                    self._accept(fd)
                continue
            if mask & _HANGUP and not connection.interest & _READ:
                connection.close()  # not reading: recv() would never say it is gone
                continue
            if mask & ~_WRITE:  # readable, or hung up / failed: recv() tells which
                connection.read()
            if mask & _WRITE and not connection.closed:
                connection.flush()
            touched.append(connection)
        if self._woken:
            self._woken = False
            for connection, stream in list(self.watching):
                if stream.call is not None and not connection.closed:
                    connection.calls.poll(stream)
                    touched.append(connection)
        if touched:
            self._serve(touched)
        if self._waiting:
            self._grant_waiting()
        if self._closing or self._accept_paused_until:
            self._expire()

    def _serve(self, touched: list[Connection]) -> None:
        """Each connection with input gets one turn of at most `frames_per_turn` frames, the kubelet's
        first; the others wait while the output queued for everyone is above the budget, and each
        waits while its own output is above the cap (its peer is not reading). Only connections
        something happened to are visited: a turn costs the same with 1 or 64 connections open."""
        if len(touched) > 1:
            touched = list(dict.fromkeys(touched))
            touched.sort(key=_not_preferred)
        limits = self.limits
        budget = limits.max_buffered
        over = self._queued > budget
        out_limit = limits.out_limit
        carry = self._carry
        for connection in touched:
            if connection.closed:
                continue
            out = connection.out
            if connection.inbuf and len(out) < out_limit and (not over or connection.preferred):
                if connection.process(limits.frames_per_turn) and len(out) < out_limit:
                    carry.append(connection)
                if connection.closed:
                    continue
            if connection.wants_push:
                connection.push_all()
            if out:
                connection.flush()
                if connection.wants_push:  # the socket took it all and answers wait: next turn, no stall
                    carry.append(connection)
            if connection.going_away and not connection.streams and not out:
                connection.close()  # the client said GOAWAY and has every answer
                continue
            queued = len(out) + connection.held
            if queued != connection.counted:
                self._queued += queued - connection.counted
                connection.counted = queued
            # _update_interest, inline: it runs for every connection served, every turn
            reading = connection.closing or (len(connection.inbuf) < _READ_AHEAD and len(out) < out_limit
                                             and (connection.preferred or not over))
            wanted = (_READ if reading else 0) | (_WRITE if out else 0)
            if wanted != connection.interest:
                connection.interest = wanted
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.modify(connection.fd, wanted)
        if over != (self._queued > budget):  # the budget flipped: everyone's reading changes
            carry.extend(c for c in self._connections.values() if c.inbuf)
            for connection in list(self._connections.values()):
                self._update_interest(connection, not over)
        if self._peak or self._queued + self.buffered > 262144:
            self._hand_back_memory(self._queued)

    def _update_interest(self, connection: Connection, over: bool) -> None:
        reading = connection.closing or (
            len(connection.inbuf) < _READ_AHEAD and len(connection.out) < self.limits.out_limit
            and (connection.preferred or not over))
        wanted = (_READ if reading else 0) | (_WRITE if connection.out else 0)
        if wanted != connection.interest:
            connection.interest = wanted
            with contextlib.suppress(OSError, ValueError):
                self._epoll.modify(connection.fd, wanted)

    def _grant_waiting(self) -> None:
        """Credit held back for the budget: all of it once there is room, else the oldest stream's
        only, so every request still completes one after another (at most one message over)."""
        if not self._waiting:
            return
        waiting = sorted(self._waiting.items(), key=lambda item: item[1].opened)
        for key, stream in waiting:
            connection = key[0]
            if self.buffered > self.limits.max_buffered and key is not waiting[0][0]:
                break
            del self._waiting[key]
            if stream.id in connection.streams and not stream.remote_closed and stream.owed:
                connection.give_stream_credit(stream, stream.owed)
                connection.flush()

    def _timeout(self) -> float:
        """Until the next timer. None while only the kubelet's connections are open (an idle plugin
        sleeps in epoll); otherwise idle and stalled connections are looked for a few times per
        timeout, not on every turn."""
        if self._carry:
            return 0.0
        if not self._closing and not self._accept_paused_until and len(self._connections) == self._preferred:
            return -1.0
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + min(15.0, self.limits.idle_timeout / 4, self.limits.stall_timeout / 4)
            self._expire()
        deadline = min(self._next_sweep, *self._closing.values()) if self._closing else self._next_sweep
        if self._accept_paused_until:
            deadline = min(deadline, self._accept_paused_until)
        return max(0.0, deadline - now)

    def _expire(self) -> None:
        now = time.monotonic()
        limits = self.limits
        for connection, deadline in list(self._closing.items()):
            if deadline <= now:
                connection.close()
        if self._accept_paused_until and self._accept_paused_until <= now:
            self._resume_accepting()
        for connection in list(self._connections.values()):
            if connection.closing or connection.closed:
                continue
            if not connection.streams and now - connection.last_activity >= limits.idle_timeout:
                log.debug("closing connection %d: idle for %.0f s", connection.fd, limits.idle_timeout)
                self._say_goodbye(connection)
            elif (connection.out or connection.held or connection.requests) and not connection.preferred \
                    and now - max(connection.last_progress, connection.last_activity) >= limits.stall_timeout:
                log.info("closing a client connection that took nothing for %.0f s", limits.stall_timeout)
                self._say_goodbye(connection)

    def _say_goodbye(self, connection: Connection) -> None:
        """GOAWAY NO_ERROR (a client may retry elsewhere), then close at once."""
        connection.abandon_streams()
        with contextlib.suppress(OSError):
            connection.sock.send(h2.goaway(connection.last_stream_id, h2.NO_ERROR))
        connection.close()

    def _accept(self, fd: int) -> None:
        listener = next((sock for sock in self._listeners if sock.fileno() == fd), None)
        if listener is None:
            return
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    self._pause_accepting(exc)
                else:
                    log.warning("accepting a connection failed: %s", exc)
                return
            if self._accept_failing:
                self._accept_failing = False
                log.info("accepting connections again")
            sock.setblocking(False)
            if len(self._connections) >= self.limits.max_connections:
                self._evict()
            connection = Connection(self, sock, Calls)
            self._connections[connection.fd] = connection
            connection.interest = _READ
            self._epoll.register(connection.fd, _READ)
            connection.flush()

    def _evict(self) -> None:
        """At the connection cap: the least recently active connection that is not the kubelet's goes."""
        candidates = [c for c in self._connections.values() if not c.preferred]
        if candidates:
            oldest = min(candidates, key=lambda c: c.last_activity)
            log.info("at %d connections: closing the least recently active one", self.limits.max_connections)
            self._say_goodbye(oldest)

    def _pause_accepting(self, exc: OSError) -> None:
        """Out of file descriptors: the listeners stay readable, so they leave epoll until a connection
        closes or `accept_retry` passes. One log line per episode."""
        if not self._accept_failing:
            self._accept_failing = True
            log.warning("cannot accept connections: %s (%d open); pausing until one closes or %.0f s pass",
                        exc.strerror or exc, len(self._connections), self.limits.accept_retry)
        if not self._accept_paused_until:
            for listener in self._listeners:
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(listener.fileno())
        self._accept_paused_until = time.monotonic() + self.limits.accept_retry

    def _resume_accepting(self) -> None:
        self._accept_paused_until = 0.0
        for listener in self._listeners:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.register(listener.fileno(), _READ)

    def _hand_back_memory(self, output: int) -> None:
        """After a burst (many MiB buffered, now drained), give freed heap back to the system: CPython
        and glibc keep it otherwise, and RSS would stay at the burst's peak."""
        queued = self.buffered + output
        self._peak = max(self._peak, queued)
        if self._peak >= 4 * 1024 * 1024 and queued < 256 * 1024:
            self._peak = 0
            _malloc_trim()

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _close_all(self) -> None:
        deadline = time.monotonic() + 0.5  # last words for every connection together, never a hang
        for connection in list(self._connections.values()):
            if not connection.closing:
                for stream in list(connection.streams.values()):
                    connection.calls.poll(stream)  # a servicer that stopped ends its streams with OK
                    call = stream.call
                    if call is not None and getattr(call, "watch", None) is not None:  # still open: we go away
                        connection.calls.end_watch_with(stream, StatusCode.UNAVAILABLE,
                                                        "the device plugin is stopping")
                connection.out += h2.goaway(connection.last_stream_id, h2.NO_ERROR)
            _flush_blocking(connection, deadline)
            connection.close()
        self.watching.clear()
        for listener in self._listeners:
            listener.close()
        self._listeners = []
        self._epoll.close()
        with self._wake_lock:
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake_r = self._wake_w = -1
        self.stopped.set()


def _not_preferred(connection: Connection) -> bool:
    return not connection.preferred


def _flush_blocking(connection: Connection, deadline: float) -> None:
    """Last words before closing (trailers, GOAWAY): a blocking write until `deadline`, never a hang."""
    if connection.closed or not connection.out:
        return
    with contextlib.suppress(OSError):
        connection.sock.settimeout(max(0.001, deadline - time.monotonic()))
        connection.sock.sendall(connection.out)
    connection.out.clear()


_libc: ctypes.CDLL | None | bool = False


def _malloc_trim() -> None:
    """glibc's malloc_trim(0); nothing where the C library has none (musl)."""
    global _libc
    if _libc is False:
        try:
            _libc = ctypes.CDLL(None)
            _libc.malloc_trim  # noqa: B018  # raises AttributeError where absent
        except (OSError, AttributeError):
            _libc = None
    if _libc:
        _libc.malloc_trim(0)
