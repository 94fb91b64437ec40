"""An HTTP/2 stream's life on the server side as RFC 9113 section 5.1 draws it: one state, one
transition table, and what a frame that arrives in each state means.

The server never pushes, so a stream starts when the client's HEADERS opens it (idle -> open,
or straight to half-closed (remote) with END_STREAM) and the reserved states never occur.
Every change of state goes through `Stream.move`; a pair missing from the table is a bug of
ours (AssertionError), never something a peer can cause.
"""

from __future__ import annotations

from . import h2


# Plain ints, not Enums: a transition is looked up twice per call, and an Enum member hashes in
# Python code (a tenth of a call's time in the server on Python 3.10).
class State:
    OPEN = 1
    HALF_CLOSED_REMOTE = 2  # the request is complete; we may still send
    HALF_CLOSED_LOCAL = 3  # we answered before the request ended
    CLOSED = 4
    NAMES = {1: "open", 2: "half-closed (remote)", 3: "half-closed (local)", 4: "closed"}


class StreamEvent:
    RECV_END_STREAM = 1
    SEND_END_STREAM = 2
    RECV_RST = 3
    SEND_RST = 4
    NAMES = {1: "END_STREAM received", 2: "END_STREAM sent", 3: "RST_STREAM received", 4: "RST_STREAM sent"}


_OPEN, _HCR, _HCL, _CLOSED = State.OPEN, State.HALF_CLOSED_REMOTE, State.HALF_CLOSED_LOCAL, State.CLOSED
TRANSITIONS: dict[tuple[int, int], int] = {
    (_OPEN, StreamEvent.RECV_END_STREAM): _HCR,
    (_OPEN, StreamEvent.SEND_END_STREAM): _HCL,
    (_HCR, StreamEvent.SEND_END_STREAM): _CLOSED,
    (_HCL, StreamEvent.RECV_END_STREAM): _CLOSED,
    **{(state, event): _CLOSED for state in (_OPEN, _HCR, _HCL)
       for event in (StreamEvent.RECV_RST, StreamEvent.SEND_RST)},
}


class How:
    """Why a closed stream closed: it decides what its late frames mean (RFC 9113 5.1, "closed")."""

    ENDED = 1  # both sides sent END_STREAM
    RESET_BY_US = 2
    RESET_BY_PEER = 3
    NAMES = {1: "both sides sent END_STREAM", 2: "we sent RST_STREAM", 3: "the client sent RST_STREAM"}


def closed_how(event: int) -> int:
    return {StreamEvent.SEND_RST: How.RESET_BY_US, StreamEvent.RECV_RST: How.RESET_BY_PEER}.get(event, How.ENDED)


def check_receive(state: int, kind: int) -> None:
    """A DATA or HEADERS frame arriving on a stream in `state` (open or half-closed): a stream error
    where the RFC names one. WINDOW_UPDATE, PRIORITY and RST_STREAM are allowed in every such state."""
    if state == _HCR and kind in (h2.DATA, h2.HEADERS):
        raise h2.StreamError(f"{'DATA' if kind == h2.DATA else 'HEADERS'} after END_STREAM", h2.STREAM_CLOSED)


def late_frame_is_error(how: int, kind: int) -> bool:
    """A frame on a stream we remember as closed: True when it is a connection error STREAM_CLOSED,
    False when it is ignored. Frames that cross our RST_STREAM are ignored (they were in flight);
    WINDOW_UPDATE and RST_STREAM may cross an END_STREAM too; DATA or HEADERS after the client's own
    END_STREAM or RST_STREAM are errors. A stream error there cannot be answered with RST_STREAM
    (no frame may be sent on a closed stream), so it ends the connection (RFC 9113 5.4.1)."""
    if how == How.RESET_BY_US or kind in (h2.WINDOW_UPDATE, h2.RST_STREAM, h2.PRIORITY):
        return False
    return kind in (h2.DATA, h2.HEADERS)


class Stream:
    """One stream's HTTP/2 side: its state, windows and what is queued to send; `call` is the
    gRPC layer's object for it."""

    __slots__ = ("id", "state", "send_window", "recv_window", "held", "received", "content_length",
                 "pending", "offset", "final", "final_is_data", "headers_sent", "call", "opened", "owed")

    def __init__(self, stream_id: int, send_window: int, recv_window: int, end_stream: bool, opened: int) -> None:
        self.id = stream_id
        self.state = _HCR if end_stream else _OPEN
        self.send_window = send_window
        self.recv_window = recv_window  # what the client may still send on this stream
        self.held = 0  # request bytes buffered for this stream
        self.owed = 0  # credit due to the client for bytes taken off the stream's window, not yet sent
        self.received = 0  # DATA payload bytes, for content-length
        self.content_length: int | None = None
        self.pending: bytes = b""  # the message being sent, from `offset` on
        self.offset = 0
        self.final: bytes | None = None  # the closing header block, sent after every message
        self.final_is_data = False  # an HTTP (not gRPC) answer: the stream ends with an empty DATA frame
        self.headers_sent = False
        self.call: object = None
        self.opened = opened  # a serial number across the server: lower is older

    def move(self, event: int) -> int:
        new = TRANSITIONS.get((self.state, event))
        assert new is not None, \
            f"stream {self.id}: no transition from {State.NAMES[self.state]} on {StreamEvent.NAMES[event]}"
        self.state = new
        return new

    @property
    def remote_closed(self) -> bool:
        return self.state in (_HCR, _CLOSED)

    @property
    def unsent(self) -> int:
        return len(self.pending) - self.offset
