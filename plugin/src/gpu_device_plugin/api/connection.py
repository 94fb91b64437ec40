"""One HTTP/2 connection, server side (RFC 9113): the preface, frames in, frames out, settings,
flow control, header blocks, errors. What the requests mean is the gRPC layer's
(`grpc_calls.Calls`); which stream may do what is `streams.py`'s table; the frame layout is
`h2.py`'s. The server's loop (`grpc_server.Server`) owns the socket's readiness, the budgets
across connections and the timers.

Errors are of the RFC's kind: `h2.ProtocolError` ends the connection (GOAWAY with its code,
then a lingering close), `h2.StreamError` resets one stream while the connection goes on; a
stream error on a stream that is idle or closed cannot be answered on that stream, so it ends
the connection (RFC 9113 5.4.1).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from typing import Any

from . import h2
from .flow import ReceiveWindow
from .limits import MAX_HEADER_LIST
from .streams import How, State, Stream, StreamEvent, check_receive, closed_how, late_frame_is_error

log = logging.getLogger(__name__)

DECODE_LIMIT = 4 * MAX_HEADER_LIST  # beyond it hpack stops mid-block: the connection ends
MAX_BLOCK = 4 * MAX_HEADER_LIST  # a compressed field block (HEADERS + CONTINUATION) at most
MAX_EMPTY_CONTINUATIONS = 8  # a field block continued by more empty frames is a flood (nghttp2 allows 8)
REMEMBERED_CLOSED = 256  # closed streams whose late frames we can still tell apart (RFC 9113 5.1)
READ_SIZE = 64 * 1024
_TABLE_SIZE_ZERO = b"\x20"  # HPACK dynamic table size update to 0: we never index anything


class Connection:
    def __init__(self, server: Any, sock: socket.socket, calls_factory: Any) -> None:
        """`server`: the grpc_server.Server serving it (budgets, stream caps, the kubelet mark);
        `calls_factory(connection)`: the layer above (grpc_calls.Calls)."""
        limits = server.limits
        self.server = server
        self.limits = limits
        self.sock = sock
        self.fd = sock.fileno()
        self.inbuf = bytearray()
        self.out = bytearray()
        self.preface_seen = False
        self.settings_seen = False
        self.decoder = h2.HeaderDecoder(DECODE_LIMIT)
        self.peer_max_frame = h2.DEFAULT_MAX_FRAME
        self.peer_initial_window = h2.DEFAULT_WINDOW
        self.peer_table_size = 4096  # the size our HPACK encoder may use; we announce 0 once it shrinks
        self.table_update = False
        self.send_window = h2.DEFAULT_WINDOW
        self.window = ReceiveWindow(limits.connection_window)
        self.streams: dict[int, Stream] = {}
        self.closed_ids: dict[int, int] = {}  # stream -> How it closed  # the newest closed streams, oldest first
        self.last_stream_id = 0
        # a field block being continued: stream, first frame's flags, block, self-dependent, empty frames
        self.continuation: tuple[int, int, bytearray, bool, int] | None = None
        self.going_away = False  # the client sent GOAWAY: no new streams
        self.closing = False  # we sent GOAWAY for an error: input is read and dropped until the peer closes
        self.closed = False
        self.preferred = False  # the kubelet's: served first, never evicted nor timed out for stalling
        self.interest = 0
        self.reading = True
        self.held = 0  # answer bytes queued on this connection's streams, not yet in `out`
        self.requests = 0  # request bytes buffered on this connection's streams
        self.wants_push = False  # output room came back: streams with something to send get a turn
        self.counted = 0  # this connection's output in the server's total, as of its last turn
        now = time.monotonic()
        self.last_activity = now  # a frame received or a byte written
        self.last_progress = now  # a byte written
        self.reset_tokens = float(limits.resets_burst)
        self.reset_refill = now
        self.calls = calls_factory(self)
        self.out += server.settings_frame

    # ------------------------------------------------------------ input

    def read(self) -> None:
        """Take what the socket has into the input buffer, which holds READ_SIZE at most."""
        try:
            data = self.sock.recv(max(READ_SIZE - len(self.inbuf), 4096) if not self.closing else READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        if not self.preferred:  # the kubelet's connection is never timed out: spare it the clock
            self.last_activity = time.monotonic()
        if self.closing:
            return  # lingering after GOAWAY: the peer's frames are read and dropped
        self.inbuf += data

    def process(self, budget: int) -> bool:
        """Handle up to `budget` frames of the input buffer; True when whole frames are left (the
        loop comes back once other connections had their turn)."""
        try:
            return self._parse(budget)
        except h2.ProtocolError as error:
            self.connection_error(error.code, str(error))
            return False

    def blocked(self) -> bool:
        """The peer is not reading what we wrote: read and parse nothing more until it takes some.
        (Answers waiting for flow-control credit do not block: the credit comes as input.)"""
        return len(self.out) >= self.limits.out_limit

    def _parse(self, budget: int) -> bool:
        buf = self.inbuf
        pos = 0
        if not self.preface_seen:
            if len(buf) < len(h2.PREFACE):
                if not h2.PREFACE.startswith(bytes(buf)):
                    raise h2.ProtocolError("not an HTTP/2 client")
                return False
            if buf[: len(h2.PREFACE)] != h2.PREFACE:
                raise h2.ProtocolError("not an HTTP/2 client")
            pos = len(h2.PREFACE)
            self.preface_seen = True
        size = len(buf)
        out = self.out
        out_limit = self.limits.out_limit
        try:
            while size - pos >= 9 and not self.closing:
                if budget <= 0 or len(out) >= out_limit:  # blocked()
                    return True
                length, kind, flags, stream_id = h2.parse_header(buf, pos)
                if length > h2.DEFAULT_MAX_FRAME:  # we never raise SETTINGS_MAX_FRAME_SIZE
                    raise h2.ProtocolError(f"a {length}-byte frame is above our maximum", h2.FRAME_SIZE_ERROR)
                if size - pos - 9 < length:
                    break
                payload = bytes(buf[pos + 9:pos + 9 + length])
                pos += 9 + length
                budget -= 1
                if not self.settings_seen and (kind != h2.SETTINGS or flags & h2.ACK):
                    raise h2.ProtocolError("the client preface must end with a SETTINGS frame")
                try:
                    self._frame(kind, flags, stream_id, payload)
                except h2.StreamError as error:
                    self._stream_error(stream_id, error)
            return False
        finally:
            del buf[:pos]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuation is not None and kind != h2.CONTINUATION:
            raise h2.ProtocolError("a field block was not continued with CONTINUATION")
        if kind == h2.DATA:
            self._data(flags, stream_id, payload)
        elif kind == h2.HEADERS:
            self._headers(flags, stream_id, payload)
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

    def _late(self, stream_id: int, kind: int, name: str) -> None:
        """A frame on a stream that is not open: idle is a connection error, closed as the RFC says."""
        if self._idle(stream_id):
            raise h2.ProtocolError(f"{name} on idle stream {stream_id}")
        how = self.closed_ids.get(stream_id)
        if how is not None and late_frame_is_error(how, kind):
            raise h2.ProtocolError(f"{name} on closed stream {stream_id} ({How.NAMES[how]})", h2.STREAM_CLOSED)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise h2.ProtocolError("SETTINGS on a stream")
        if flags & h2.ACK:
            if payload:
                raise h2.ProtocolError("a SETTINGS acknowledgement with a payload", h2.FRAME_SIZE_ERROR)
            return
        entries = h2.parse_settings(payload)
        self.settings_seen = True
        for key, value in entries:  # in order, as RFC 9113 6.5.3 says: each one takes effect as read
            self._setting(key, value)
        self.out += h2.frame(h2.SETTINGS, h2.ACK, 0)
        self.wants_push = True

    def _setting(self, key: int, value: int) -> None:
        if key == h2.ENABLE_PUSH and value > 1:
            raise h2.ProtocolError("SETTINGS_ENABLE_PUSH must be 0 or 1")
        if key == h2.MAX_FRAME_SIZE:
            if not h2.DEFAULT_MAX_FRAME <= value <= (1 << 24) - 1:
                raise h2.ProtocolError("invalid SETTINGS_MAX_FRAME_SIZE")
            self.peer_max_frame = value
        elif key == h2.HEADER_TABLE_SIZE:
            if value < self.peer_table_size:
                self.peer_table_size = 0  # announced in our next field block (RFC 7541 4.2)
                self.table_update = True
        elif key == h2.INITIAL_WINDOW_SIZE:
            if value > h2.MAX_WINDOW:
                raise h2.ProtocolError("invalid SETTINGS_INITIAL_WINDOW_SIZE", h2.FLOW_CONTROL_ERROR)
            delta = value - self.peer_initial_window
            self.peer_initial_window = value
            for stream in self.streams.values():
                stream.send_window += delta
                if stream.send_window > h2.MAX_WINDOW:
                    raise h2.ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE pushed a stream window past 2^31-1",
                                           h2.FLOW_CONTROL_ERROR)

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
            if self.held:  # only answers already queued can have waited for this credit
                self.wants_push = True
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            self._late(stream_id, h2.WINDOW_UPDATE, "WINDOW_UPDATE")
            return
        if not increment:
            raise h2.StreamError("a stream window increment of 0")
        stream.send_window += increment
        if stream.send_window > h2.MAX_WINDOW:
            raise h2.StreamError("the stream window past 2^31-1", h2.FLOW_CONTROL_ERROR)
        self.push(stream)

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise h2.ProtocolError("a RST_STREAM payload is 4 bytes", h2.FRAME_SIZE_ERROR)
        if stream_id == 0:
            raise h2.ProtocolError("RST_STREAM on stream 0")
        stream = self.streams.get(stream_id)
        if stream is None:
            self._late(stream_id, h2.RST_STREAM, "RST_STREAM")
            return
        self._charge_reset()
        self._close(stream, StreamEvent.RECV_RST)  # closed by the client: nothing more is sent on it

    def _charge_reset(self) -> None:
        """A stream the client reset before we were done with it costs a token; a connection out of
        tokens is resetting faster than any client that uses its answers (rapid reset)."""
        now = time.monotonic()
        limits = self.limits
        self.reset_tokens = min(limits.resets_burst,
                                self.reset_tokens + (now - self.reset_refill) * limits.resets_per_second)
        self.reset_refill = now
        self.reset_tokens -= 1
        if self.reset_tokens < 0:
            raise h2.ProtocolError("too many streams reset by the client", h2.ENHANCE_YOUR_CALM)

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
        block, self_dependent = h2.header_fragment(payload, flags, stream_id)
        if flags & h2.END_HEADERS:
            self._header_block(stream_id, flags, block, self_dependent)
        else:
            self.continuation = (stream_id, flags, bytearray(block), self_dependent, 0)

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuation is None or self.continuation[0] != stream_id:
            raise h2.ProtocolError("CONTINUATION without HEADERS on that stream")
        _, first_flags, block, self_dependent, empty = self.continuation
        block += payload
        if len(block) > MAX_BLOCK:
            raise h2.ProtocolError("a field block larger than we take", h2.ENHANCE_YOUR_CALM)
        if not payload:
            empty += 1
            if empty > MAX_EMPTY_CONTINUATIONS:
                raise h2.ProtocolError("a field block continued by empty CONTINUATION frames", h2.ENHANCE_YOUR_CALM)
            self.continuation = (stream_id, first_flags, block, self_dependent, empty)
        if flags & h2.END_HEADERS:
            self.continuation = None
            self._header_block(stream_id, first_flags, bytes(block), self_dependent)

    def _header_block(self, stream_id: int, flags: int, block: bytes, self_dependent: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:  # a second block: the request's trailers
            fields = self.decoder.decode(block)  # always: the dynamic table must stay in step
            if self_dependent:
                raise h2.StreamError(f"stream {stream_id} depends on itself")
            check_receive(stream.state, h2.HEADERS)
            if not flags & h2.END_STREAM:
                raise h2.StreamError("a second HEADERS block must end the stream")
            self.calls.check_trailers(fields)
            self._end_of_request(stream)
            return
        if stream_id % 2 == 0:
            raise h2.ProtocolError(f"stream {stream_id} is even: a client opens odd streams only")
        if stream_id <= self.last_stream_id:
            self.decoder.decode(block)
            how = self.closed_ids.get(stream_id)
            if how is None:  # RFC 9113 5.1.1: a new stream's id must be above every earlier one
                raise h2.ProtocolError(f"stream {stream_id} opened after stream {self.last_stream_id}")
            if late_frame_is_error(how, h2.HEADERS):
                raise h2.ProtocolError(f"HEADERS on closed stream {stream_id}", h2.STREAM_CLOSED)
            return  # its late frames are ignored
        route = self.calls.route(block)
        self.last_stream_id = stream_id
        if self_dependent:
            self._reset_id(stream_id, h2.PROTOCOL_ERROR)
            return
        server = self.server
        if self.going_away or not server.may_open_stream(self):
            self._reset_id(stream_id, h2.REFUSED_STREAM)
            return
        server.serial += 1
        stream = Stream(stream_id, self.peer_initial_window, self.limits.stream_window, bool(flags & h2.END_STREAM),
                        server.serial)
        self.streams[stream_id] = stream
        server.open_streams += 1
        self.calls.open(stream, route)  # a malformed request raises its stream error here
        if flags & h2.END_STREAM and stream_id in self.streams:
            self._end_of_request(stream)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise h2.ProtocolError("DATA on stream 0")
        length = len(payload)  # padding included: it counts against flow control
        # the connection's window is flow control only: credit as DATA is read (a WINDOW_UPDATE per half window)
        increment = self.window.receive(length)
        if increment < 0:
            raise h2.ProtocolError("the client overran our connection window", h2.FLOW_CONTROL_ERROR)
        if increment:
            self.out += h2.window_update(0, increment)
        stream = self.streams.get(stream_id)
        if stream is None:
            self._late(stream_id, h2.DATA, "DATA")
            return  # we reset it: its late data is dropped
        if stream.state != State.OPEN:
            check_receive(stream.state, h2.DATA)
        data = h2.unpadded(payload, flags) if flags & h2.PADDED else payload
        stream.recv_window -= length
        if stream.recv_window < 0:
            raise h2.StreamError("the client overran the stream's window", h2.FLOW_CONTROL_ERROR)
        stream.received += len(data)
        if stream.content_length is not None and stream.received > stream.content_length:
            raise h2.StreamError("more DATA than content-length")
        if flags & h2.END_STREAM:  # the last chunk goes with the end: a one-frame request is never held
            self._end_of_request(stream, data)
            return
        kept = self.calls.data(stream, data)
        if kept:
            self.hold(stream, kept)
        # credit as the bytes arrive, budget allowing: a message of any size gets through
        self.server.grant(self, stream, length)

    def hold(self, stream: Stream, length: int) -> None:
        """`length` request bytes buffered for `stream` (negative: released)."""
        stream.held += length
        self.requests += length
        self.server.buffered += length

    def release(self, stream: Stream) -> None:
        """The stream's buffered request is consumed or dropped: its bytes leave the budget."""
        held = stream.held
        if held:
            stream.held = 0
            self.requests -= held
            self.server.buffered -= held

    def give_stream_credit(self, stream: Stream, length: int) -> None:
        stream.recv_window += length
        stream.owed -= length
        self.out += h2.window_update(stream.id, length)

    def _end_of_request(self, stream: Stream, last: bytes = b"") -> None:
        """The request ended (END_STREAM), `last` its final DATA (if any): checked, then handled."""
        if stream.state == State.OPEN:
            stream.move(StreamEvent.RECV_END_STREAM)
        if stream.content_length is not None and stream.received != stream.content_length:
            raise h2.StreamError(f"{stream.received} bytes of DATA where content-length says {stream.content_length}")
        if stream.state == State.CLOSED:
            self._closed(stream, How.ENDED)
            return
        self.calls.end_of_request(stream, last)

    # ------------------------------------------------------------ output

    def header_frame(self, stream_id: int, flags: int, block: bytes) -> bytes:
        if self.table_update:  # the peer shrank its table: our next block says we use none
            block = _TABLE_SIZE_ZERO + block
            self.table_update = False
        return h2.frame(h2.HEADERS, flags | h2.END_HEADERS, stream_id, block)

    def start_response(self, stream: Stream, block: bytes) -> None:
        if not stream.headers_sent:
            self.out += self.header_frame(stream.id, 0, block)
            stream.headers_sent = True

    def send(self, stream: Stream, message: bytes) -> None:
        """Queue `message` (already framed for its protocol) after what the stream has unsent."""
        if stream.unsent:
            self.held -= stream.unsent
            message = stream.pending[stream.offset:] + message
        stream.pending, stream.offset = message, 0
        self.held += len(message)
        self.push(stream)

    def push(self, stream: Stream) -> None:
        """Send what flow control and the output cap allow of the stream's messages, then its end."""
        out = self.out
        sid = stream.id
        limit = self.limits.out_limit
        while True:
            pending, offset = stream.pending, stream.offset
            while offset < len(pending):
                allowed = min(self.send_window, stream.send_window, self.peer_max_frame, len(pending) - offset)
                if allowed <= 0 or len(out) >= limit:
                    self.held -= offset - stream.offset
                    stream.offset = offset
                    return
                out += h2.frame(h2.DATA, 0, sid, pending[offset:offset + allowed])
                offset += allowed
                self.send_window -= allowed
                stream.send_window -= allowed
            self.held -= len(pending) - stream.offset
            stream.pending, stream.offset = b"", 0
            following = self.calls.next_message(stream)
            if following is None:
                break
            stream.pending = following
            self.held += len(following)
        if stream.final is None:
            return
        if stream.final_is_data:
            out += h2.frame(h2.DATA, h2.END_STREAM, sid)
        else:
            out += self.header_frame(sid, h2.END_STREAM, stream.final)
        stream.final = None
        self.finished(stream)

    def finished(self, stream: Stream) -> None:
        """END_STREAM went out: closed if the request had ended too."""
        if stream.move(StreamEvent.SEND_END_STREAM) == State.CLOSED:
            self._closed(stream, How.ENDED)
        else:  # answered before the request ended: ask the client to stop (RFC 9113 8.1, gRPC)
            self.reset(stream, h2.NO_ERROR)

    def push_all(self) -> None:
        self.wants_push = False
        for stream in list(self.streams.values()):
            if stream.unsent or stream.final is not None or self.calls.has_queued(stream):
                self.push(stream)

    # ------------------------------------------------------------ ending streams

    def _stream_error(self, stream_id: int, error: h2.StreamError) -> None:
        """RST_STREAM for a stream that is open or half-closed; on an idle or closed one no frame may
        be sent, so the connection ends instead (RFC 9113 5.4: a stream error may always be treated so)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            if self.closed_ids.get(stream_id) == How.RESET_BY_US:
                return  # we reset it already; what the client sent meanwhile is moot
            raise h2.ProtocolError(str(error), error.code)
        log.debug("resetting stream %d: %s", stream_id, error)
        self.reset(stream, error.code)

    def reset(self, stream: Stream, code: int) -> None:
        self.out += h2.rst_stream(stream.id, code)
        self._close(stream, StreamEvent.SEND_RST)

    def _reset_id(self, stream_id: int, code: int) -> None:
        self.out += h2.rst_stream(stream_id, code)
        self._remember(stream_id, How.RESET_BY_US)

    def _remember(self, stream_id: int, how: int) -> None:
        closed = self.closed_ids
        closed[stream_id] = how
        if len(closed) > REMEMBERED_CLOSED:
            del closed[next(iter(closed))]

    def _close(self, stream: Stream, event: int) -> None:
        stream.move(event)
        self._closed(stream, closed_how(event))

    def _closed(self, stream: Stream, how: int) -> None:
        """However a stream ends: the gRPC layer lets go of it, its slot and buffers go back."""
        stream_id = stream.id
        if self.streams.pop(stream_id, None) is None:
            return
        self.server.open_streams -= 1
        closed = self.closed_ids  # _remember, inline: once per call
        closed[stream_id] = how
        if len(closed) > REMEMBERED_CLOSED:
            del closed[next(iter(closed))]
        stream.state = State.CLOSED
        call = stream.call
        if call is not None and (call.watch is not None or call.queued is not None):  # type: ignore[attr-defined]
            self.calls.closed(stream)
        if stream.held:
            self.release(stream)
        if stream.pending:
            self.held -= len(stream.pending) - stream.offset
            stream.pending, stream.offset = b"", 0
        stream.final = None

    # ------------------------------------------------------------ output and teardown

    def connection_error(self, code: int, message: str) -> None:
        """GOAWAY with `code`; the connection then reads and drops the peer's frames until it closes
        (so our GOAWAY is not lost to a reset) or the grace period ends."""
        if self.closing or self.closed:
            return
        log.debug("closing a client connection: %s", message)
        self.abandon_streams()
        self.out += h2.goaway(self.last_stream_id, code, message.encode()[:200])
        self.closing = True
        self.inbuf.clear()
        self.continuation = None
        self.server.closing_at(self, time.monotonic() + self.limits.close_grace)
        self.flush()

    def abandon_streams(self) -> None:
        """Every stream ends without a frame of its own (a GOAWAY or the socket's end says it)."""
        for stream in list(self.streams.values()):
            self._closed(stream, How.RESET_BY_US)

    def flush(self) -> None:
        """Write what is queued; what the socket does not take now waits for EPOLLOUT."""
        if self.closed:
            return
        out = self.out
        while out:
            try:
                sent = self.sock.send(out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                return
            del out[:sent]
            if not self.preferred:
                self.last_activity = self.last_progress = time.monotonic()
        if self.closing and not out:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)  # GOAWAY is out: the peer sees EOF, we read until it closes
        if self.held and len(out) < self.limits.out_limit // 2 and not self.closing:
            self.wants_push = True  # room again: streams waiting on the output cap continue (no stall)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for stream in list(self.streams.values()):
            self._closed(stream, How.RESET_BY_US)
        self.out.clear()
        self.inbuf.clear()
        self.server.forget(self)
        with contextlib.suppress(OSError):
            self.sock.close()
