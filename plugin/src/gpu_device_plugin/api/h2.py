"""HTTP/2 framing (RFC 9113) for gRPC over a local socket: frame layout, settings, errors.

Only what gRPC needs: no push, no priorities (checked and ignored), no TLS (h2c with
prior knowledge, as gRPC uses on Unix sockets). Header blocks are coded with `hpack` (the
python-hyper HPACK codec, a meta-python recipe on every Yocto series we build).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# settings identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = (
    1, 2, 3, 4, 5, 6)

# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = (1 << 31) - 1

_HEADER = struct.Struct(">HBBBI")  # 24-bit length as 16 + 8 bits, type, flags, stream id


class ProtocolError(Exception):
    """The peer broke HTTP/2: the connection ends with GOAWAY and this error code."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class StreamError(Exception):
    """The peer broke HTTP/2 on one stream: that stream ends with RST_STREAM and this code."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class CompressionError(ProtocolError):
    """A header block that cannot be decoded: the connection's HPACK state is lost."""

    def __init__(self, message: str) -> None:
        super().__init__(message, COMPRESSION_ERROR)


def header_block(fields: Iterable[tuple[bytes, bytes]]) -> bytes:
    """A header block that leaves no state behind: every field is a static-table index or a
    never-indexed literal, so blocks can be built once and sent on any connection."""
    return hpack.Encoder().encode([(name, value, True) for name, value in fields])


class HeaderDecoder:
    """hpack's decoder for one connection, plus `generation`, which moves whenever the
    dynamic table may have changed: a decoded block can be reused until it does."""

    def __init__(self, max_header_list: int = 65536) -> None:
        # hpack checks the limit while it decodes, after the table may have changed: a block over
        # it leaves the connection's table unknown, so it can only end the connection
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list)
        self._table = self._decoder.header_table
        self.generation = 0

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        entries = self._table.dynamic_entries
        newest = entries[0] if entries else None  # held, so a new entry cannot reuse its id
        size = self._table.maxsize
        try:
            return self._decoder.decode(block, raw=True)
        except hpack.OversizedHeaderListError:
            raise ProtocolError("a header list larger than we decode", ENHANCE_YOUR_CALM) from None
        except hpack.HPACKError as error:
            raise CompressionError(f"undecodable header block: {error}") from None
        finally:
            if self._table.maxsize != size or (entries[0] if entries else None) is not newest:
                self.generation += 1


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id & MAX_WINDOW) + payload


def parse_header(buffer: bytes | bytearray, pos: int = 0) -> tuple[int, int, int, int]:
    """(length, type, flags, stream id) of the frame header at `pos` (9 bytes)."""
    high, low, kind, flags, stream_id = _HEADER.unpack_from(buffer, pos)
    return (high << 8) | low, kind, flags, stream_id & MAX_WINDOW


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", key, value) for key, value in values.items()))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """(identifier, value) in the frame's order: each must be applied as read (RFC 9113 6.5.3)."""
    if len(payload) % 6:
        raise ProtocolError("SETTINGS payload is not a multiple of 6 bytes", FRAME_SIZE_ERROR)
    return [struct.unpack_from(">HI", payload, pos) for pos in range(0, len(payload), 6)]


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + debug)


def unpadded(payload: bytes, flags: int) -> bytes:
    """A DATA or HEADERS payload without its padding (a pad length past the frame: PROTOCOL_ERROR)."""
    if not flags & PADDED:
        return payload
    if not payload:
        raise ProtocolError("a padded frame without its pad length", FRAME_SIZE_ERROR)
    if payload[0] >= len(payload):
        raise ProtocolError("padding longer than the frame")
    return payload[1:len(payload) - payload[0]]


def header_fragment(payload: bytes, flags: int, stream_id: int) -> tuple[bytes, bool]:
    """A HEADERS payload's field block fragment, and whether its priority fields make the stream depend
    on itself. Too short for the pad length and priority fields: FRAME_SIZE_ERROR; padding longer
    than what is left after them: PROTOCOL_ERROR (RFC 9113 6.2)."""
    if not flags & (PADDED | PRIORITY_FLAG):
        return payload, False
    start = 1 if flags & PADDED else 0
    if flags & PRIORITY_FLAG:
        start += 5
    if len(payload) < start:
        raise ProtocolError("HEADERS too short for its pad length and priority fields", FRAME_SIZE_ERROR)
    end = len(payload)
    if flags & PADDED:
        end -= payload[0]
        if end < start:
            raise ProtocolError("padding longer than the frame")
    self_dependent = bool(flags & PRIORITY_FLAG) and u31(payload[start - 5:start]) == stream_id
    return payload[start:end], self_dependent


def u31(payload: bytes) -> int:
    """The 31-bit value (window increment, stream id) at the start of a payload, reserved bit dropped."""
    return struct.unpack_from(">I", payload)[0] & MAX_WINDOW


def u32(payload: bytes) -> int:
    """An error code: all 32 bits."""
    return struct.unpack_from(">I", payload)[0]


def grpc_message(message: bytes) -> bytes:
    """gRPC's length-prefixed message: not compressed, 4-byte big-endian length."""
    return struct.pack(">BI", 0, len(message)) + message
