"""A tiny raw HTTP/2 client for tests: frames built by hand (struct) and header blocks by the
hpack library, independent of the plugin's own h2.py, so a test can send what no
well-behaved client sends and see every frame the server answers with.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x5, 0x6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x8, 0x9, 0xB
NAMES = {DATA: "DATA", HEADERS: "HEADERS", PRIORITY: "PRIORITY", RST_STREAM: "RST_STREAM", SETTINGS: "SETTINGS",
         PUSH_PROMISE: "PUSH_PROMISE", PING: "PING", GOAWAY: "GOAWAY", WINDOW_UPDATE: "WINDOW_UPDATE",
         CONTINUATION: "CONTINUATION"}

ALLOCATE = "/v1beta1.DevicePlugin/Allocate"
LIST_AND_WATCH = "/v1beta1.DevicePlugin/ListAndWatch"
OPTIONS = "/v1beta1.DevicePlugin/GetDevicePluginOptions"


class Frame(NamedTuple):
    kind: int
    flags: int
    stream: int
    payload: bytes

    def __repr__(self) -> str:
        return f"{NAMES.get(self.kind, self.kind)}(flags={self.flags:#x}, stream={self.stream}, {self.payload[:40]!r})"

    @property
    def error_code(self) -> int:
        """RST_STREAM's code, or GOAWAY's."""
        return struct.unpack_from(">I", self.payload, 4 if self.kind == GOAWAY else 0)[0]


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def settings(values: dict[int, int] | None = None, ack: bool = False) -> bytes:
    body = b"".join(struct.pack(">HI", key, value) for key, value in (values or {}).items())
    return frame(SETTINGS, ACK if ack else 0, 0, body)


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def ping(data: bytes = b"12345678", ack: bool = False) -> bytes:
    return frame(PING, ACK if ack else 0, 0, data)


def priority(stream: int, depends_on: int, weight: int = 15) -> bytes:
    return frame(PRIORITY, 0, stream, struct.pack(">IB", depends_on, weight))


def grpc_message(message: bytes, compressed: int = 0) -> bytes:
    return struct.pack(">BI", compressed, len(message)) + message


def request_fields(path: str = ALLOCATE, method: bytes = b"POST",
                   extra: Iterable[tuple[bytes, bytes]] = ()) -> list[tuple[bytes, bytes]]:
    return [(b":method", method), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"), (b"te", b"trailers"), *extra]


class Peer:
    """One connection: `Peer(path)` sends the preface and SETTINGS; `handshake()` reads the server's."""

    def __init__(self, path: str, settings_values: dict[int, int] | None = None, preface: bytes = PREFACE,
                 send_settings: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(path)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buf = bytearray()
        self.server_settings: dict[int, int] = {}
        self.sock.sendall(preface + (settings(settings_values) if send_settings else b""))

    # ------------------------------------------------------------ sending

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def block(self, fields: Iterable[tuple[bytes, bytes]]) -> bytes:
        return self.encoder.encode(list(fields))

    def headers(self, stream: int, fields: Iterable[tuple[bytes, bytes]], end_stream: bool = False,
                flags: int = END_HEADERS) -> bytes:
        return frame(HEADERS, flags | (END_STREAM if end_stream else 0), stream, self.block(fields))

    def call(self, stream: int, message: bytes, path: str = ALLOCATE) -> bytes:
        """HEADERS then one DATA frame with the gRPC message and END_STREAM."""
        return self.headers(stream, request_fields(path)) + frame(DATA, END_STREAM, stream, grpc_message(message))

    # ------------------------------------------------------------ receiving

    def frames(self, wait: float = 2.0) -> Iterator[Frame]:
        """Frames as they come, until nothing arrives for `wait` seconds or the server closes."""
        self.sock.settimeout(wait)
        while True:
            while len(self.buf) >= 9:
                length = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) < 9 + length:
                    break
                kind, flags = self.buf[3], self.buf[4]
                stream = struct.unpack_from(">I", self.buf, 5)[0] & 0x7FFFFFFF
                payload = bytes(self.buf[9:9 + length])
                del self.buf[:9 + length]
                yield Frame(kind, flags, stream, payload)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return
            except OSError:  # reset, or closed by the test meanwhile
                return
            if not data:
                return
            self.buf += data

    def handshake(self) -> dict[int, int]:
        """Read the server's SETTINGS, acknowledge them; the server's settings."""
        for got in self.frames():
            if got.kind == SETTINGS and not got.flags & ACK:
                self.server_settings = dict(struct.unpack_from(">HI", got.payload, i)
                                            for i in range(0, len(got.payload), 6))
                self.send(settings(ack=True))
                return self.server_settings
        raise AssertionError("the server sent no SETTINGS")

    def until(self, predicate, wait: float = 5.0) -> list[Frame]:
        """Frames up to and including the first that satisfies `predicate` (AssertionError if none)."""
        seen = []
        for got in self.frames(wait):
            seen.append(got)
            if predicate(got):
                return seen
        raise AssertionError(f"no such frame; got {seen}")

    def decode(self, got: Frame) -> dict[bytes, bytes]:
        block = got.payload
        if got.flags & PADDED:
            block = block[1:len(block) - block[0]]
        if got.flags & PRIORITY_FLAG:
            block = block[5:]
        return dict(self.decoder.decode(block, raw=True))

    def response(self, stream: int, wait: float = 5.0) -> tuple[dict[bytes, bytes], bytes, list[Frame]]:
        """The fields of every HEADERS frame on `stream`, its DATA, and the frames seen, up to END_STREAM."""
        fields: dict[bytes, bytes] = {}
        data = bytearray()
        seen = []
        for got in self.frames(wait):
            seen.append(got)
            if got.stream != stream:
                if got.kind == HEADERS:
                    self.decode(got)  # keep the table in step
                continue
            if got.kind == HEADERS:
                fields.update(self.decode(got))
            elif got.kind == DATA:
                data += got.payload
            elif got.kind == RST_STREAM:
                raise AssertionError(f"stream {stream} reset with code {got.error_code}: {seen}")
            if got.kind in (HEADERS, DATA) and got.flags & END_STREAM:
                return fields, bytes(data), seen
        raise AssertionError(f"no end of stream {stream}; got {seen}")

    def alive(self) -> bool:
        """The connection still works: a PING is answered."""
        self.send(ping(b"liveness"))
        try:
            self.until(lambda f: f.kind == PING and f.flags & ACK and f.payload == b"liveness", wait=5)
        except AssertionError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def closed_by_server(peer: Peer, wait: float = 5.0) -> bool:
    """The server closed the connection (EOF or reset) within `wait` seconds."""
    for _ in peer.frames(wait):
        pass
    peer.sock.settimeout(0.05)
    try:
        return peer.sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True
