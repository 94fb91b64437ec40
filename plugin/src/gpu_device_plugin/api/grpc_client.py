"""One unary gRPC call over a Unix socket, without grpcio: Register with the kubelet, the
kubelet's PodResources List for the metrics, and the watchdog's probe of our own server. A
fresh connection per call: each is rare (once per registration, per scrape, per watchdog
period), and a fresh one never sits in back-off.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time

from . import h2
from .status import RpcFailure, StatusCode, decode_message, status_code

MAX_RESPONSE = 4 * 1024 * 1024
_RST_CODES = {h2.CANCEL: StatusCode.CANCELLED, h2.REFUSED_STREAM: StatusCode.UNAVAILABLE}


def call(socket_path: str, method: str, request: bytes, timeout: float) -> bytes:
    """Call `method` ("/package.Service/Method") with a serialized request; the serialized
    response, or RpcFailure (UNAVAILABLE when nothing listens, DEADLINE_EXCEEDED on timeout)."""
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
        except OSError as exc:
            raise RpcFailure(StatusCode.UNAVAILABLE, f"cannot connect to {socket_path}: "
                             f"{exc.strerror or exc}") from None
        try:
            sock.sendall(_request_bytes(method, request, timeout))
            return _read_response(sock, deadline)
        except TimeoutError:
            raise RpcFailure(StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout:g} s") from None
        except h2.ProtocolError as exc:  # a frame no server may send: the call fails, the caller goes on
            raise RpcFailure(StatusCode.INTERNAL, f"the server broke HTTP/2: {exc}") from None
        except OSError as exc:
            raise RpcFailure(StatusCode.UNAVAILABLE, f"connection to {socket_path} failed: "
                             f"{exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            sock.close()


def _request_bytes(method: str, request: bytes, timeout: float) -> bytes:
    headers = h2.header_block([
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", method.encode()), (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers"),
        (b"grpc-timeout", f"{max(1, int(timeout * 1000))}m".encode()),
    ])
    body = h2.grpc_message(request)
    if len(body) > h2.DEFAULT_WINDOW:
        raise ValueError("request larger than the default flow-control window")
    out = bytearray(h2.PREFACE)
    out += h2.settings({h2.ENABLE_PUSH: 0, h2.INITIAL_WINDOW_SIZE: MAX_RESPONSE + 5})
    # SETTINGS opens only the stream's window; the connection's stays at 64 KiB until we grant
    # more, and an answer past it (a PodResources List of a busy node) would stall to the deadline.
    out += h2.window_update(0, MAX_RESPONSE + 5 - h2.DEFAULT_WINDOW)
    out += h2.frame(h2.HEADERS, h2.END_HEADERS, 1, headers)
    chunks = [body[i:i + h2.DEFAULT_MAX_FRAME] for i in range(0, len(body), h2.DEFAULT_MAX_FRAME)] or [b""]
    for index, chunk in enumerate(chunks):
        out += h2.frame(h2.DATA, h2.END_STREAM if index == len(chunks) - 1 else 0, 1, chunk)
    return bytes(out)


def _read_response(sock: socket.socket, deadline: float) -> bytes:
    decoder = h2.HeaderDecoder()
    buf = bytearray()
    body = bytearray()
    headers: dict[bytes, bytes] = {}
    block: bytearray | None = None  # a header block continued in CONTINUATION frames
    block_flags = 0
    while True:
        while len(buf) >= 9:
            length, kind, flags, stream_id = h2.parse_header(buf)
            if len(buf) < 9 + length:
                break
            payload = bytes(buf[9:9 + length])
            del buf[:9 + length]
            if kind == h2.SETTINGS and not flags & h2.ACK:
                sock.sendall(h2.frame(h2.SETTINGS, h2.ACK, 0))
            elif kind == h2.PING and not flags & h2.ACK:
                sock.sendall(h2.frame(h2.PING, h2.ACK, 0, payload))
            elif kind == h2.GOAWAY and len(payload) < 8:
                raise h2.ProtocolError(f"a GOAWAY of {len(payload)} bytes (RFC 9113 6.8: at least 8)",
                                       h2.FRAME_SIZE_ERROR)
            elif kind == h2.GOAWAY and struct.unpack_from(">I", payload)[0] & h2.MAX_WINDOW < 1:
                raise RpcFailure(StatusCode.UNAVAILABLE, "the server refused the call (GOAWAY)")
            elif stream_id != 1:
                continue
            elif kind == h2.RST_STREAM:
                code = h2.u32(payload) if len(payload) == 4 else h2.PROTOCOL_ERROR
                raise RpcFailure(_RST_CODES.get(code, StatusCode.INTERNAL), f"stream reset (HTTP/2 error {code})")
            elif kind == h2.DATA:
                body += h2.unpadded(payload, flags)
                if len(body) > MAX_RESPONSE + 5:
                    raise RpcFailure(StatusCode.RESOURCE_EXHAUSTED, "response larger than 4 MiB")
            elif kind in (h2.HEADERS, h2.CONTINUATION):
                if kind == h2.HEADERS:
                    fragment = h2.unpadded(payload, flags)
                    block, block_flags = bytearray(fragment[5:] if flags & h2.PRIORITY_FLAG else fragment), flags
                elif block is not None:
                    block += payload
                if block is not None and flags & h2.END_HEADERS:
                    try:
                        headers.update(decoder.decode(bytes(block)))
                    except h2.CompressionError as exc:
                        raise RpcFailure(StatusCode.INTERNAL, f"undecodable response headers: {exc}") from None
                    block = None
                    if block_flags & h2.END_STREAM:
                        return _result(headers, body)
            if kind == h2.DATA and flags & h2.END_STREAM:
                return _result(headers, body)
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        data = sock.recv(65536)
        if not data:
            raise RpcFailure(StatusCode.UNAVAILABLE, "the server closed the connection before answering")
        buf += data


def _result(headers: dict[bytes, bytes], body: bytearray) -> bytes:
    http_status = headers.get(b":status", b"200")
    if http_status != b"200":
        raise RpcFailure(StatusCode.UNKNOWN, f"HTTP status {http_status.decode(errors='replace')}")
    code = status_code(headers.get(b"grpc-status"))
    if code != StatusCode.OK:
        raise RpcFailure(code, decode_message(headers.get(b"grpc-message", b"")))
    if len(body) < 5:
        raise RpcFailure(StatusCode.INTERNAL, "the response has no message")
    compressed, length = struct.unpack_from(">BI", body)
    if compressed or length != len(body) - 5:
        raise RpcFailure(StatusCode.INTERNAL, "the response is not one uncompressed message")
    return bytes(body[5:])
