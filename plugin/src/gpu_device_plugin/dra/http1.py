"""The HTTP/1.1 client side the API client needs (RFC 9112): one request at a time on a kept-alive
connection, bodies by Content-Length, chunked or until close, and a response read line by line for
watches. On a plain or TLS socket.

Why not http.client: it parses every response's header block with the email package, about a
tenth of a prepare's time in the driver, and loads email, calendar and more at start. The API
server's answers are simple (JSON, no compression asked for, no 1xx but 100-continue we never
ask for), so this is a few lines of framing.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024  # a list of every ResourceClaim would be far smaller


class HttpError(OSError):
    """The server broke HTTP/1.1 framing, or the connection ended mid-response."""


class Response:
    def __init__(self, status: int, reason: str, headers: dict[str, str]) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers  # names lowercased; a repeated field keeps its last value


class HttpConnection:
    def __init__(self, host: str, port: int, context: ssl.SSLContext | None, timeout: float | None,
                 server_name: str = "") -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request goes in one write anyway
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=server_name or host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.host = host if ":" not in host else f"[{host}]"
        self.port = port
        self._reader = sock.makefile("rb")
        self.reusable = True

    def close(self) -> None:
        self.reusable = False
        with contextlib.suppress(OSError):
            self._reader.close()
        with contextlib.suppress(OSError):
            self.sock.close()

    def shutdown(self) -> None:
        """From another thread: a blocked read returns (end of stream)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def send(self, method: str, target: str, headers: dict[str, str], body: bytes | None) -> Response:
        """Send a request and read the response's head; the body follows with `read_body` or `lines`."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        return self._head()

    def _head(self) -> Response:
        status_line = self._reader.readline(MAX_HEADER_BYTES)
        if not status_line:
            raise HttpError("the server closed the connection before answering")
        parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
        headers: dict[str, str] = {}
        size = len(status_line)
        while True:
            line = self._reader.readline(MAX_HEADER_BYTES)
            size += len(line)
            if not line or size > MAX_HEADER_BYTES:
                raise HttpError("the response's header block is cut short or too large")
            if line in (b"\r\n", b"\n"):
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise HttpError(f"a header line without a colon: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        if parts[0] == "HTTP/1.0" or "close" in headers.get("connection", "").lower():
            self.reusable = False
        return Response(int(parts[1]), parts[2] if len(parts) > 2 else "", headers)

    def read_body(self, response: Response) -> bytes:
        if "chunked" in response.headers.get("transfer-encoding", "").lower():
            return b"".join(self._chunks())
        length = response.headers.get("content-length")
        if length is not None:
            if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                raise HttpError(f"Content-Length {length!r} is not a size this client reads")
            data = self._reader.read(int(length))
            if len(data) != int(length):
                raise HttpError("the connection ended inside the response body")
            return data
        self.reusable = False  # a body delimited by the end of the connection
        return self._reader.read(MAX_BODY_BYTES)

    def _chunks(self) -> Iterator[bytes]:
        total = 0
        while True:
            size_line = self._reader.readline(1024)
            size_text = size_line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpError(f"a bad chunk size line: {size_line[:40]!r}") from None
            if size == 0:
                while self._reader.readline(MAX_HEADER_BYTES) not in (b"\r\n", b"\n", b""):
                    pass  # trailer fields: none we read
                return
            total += size
            if total > MAX_BODY_BYTES:
                raise HttpError("a chunked body larger than this client reads")
            data = self._reader.read(size)
            if len(data) != size or self._reader.read(2) != b"\r\n":
                raise HttpError("the connection ended inside a chunk")
            yield data

    def lines(self, response: Response) -> Iterator[bytes]:
        """The body line by line as it arrives (a watch: one JSON event a line), chunked or not."""
        if "chunked" not in response.headers.get("transfer-encoding", "").lower():
            yield from iter(self._reader.readline, b"")
            return
        pending = b""
        for chunk in self._chunks():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line + b"\n"
        if pending:
            yield pending
