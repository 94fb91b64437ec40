"""A request's header list checked as RFC 9113 section 8 says, read as gRPC needs it.

A malformed request (section 8.1.1) is a stream error of type PROTOCOL_ERROR: `Malformed`
says why. A well-formed request that is not gRPC (another method, another content type)
is the server's to answer with an HTTP status; that is not decided here.
"""

from .h2 import PROTOCOL_ERROR, StreamError


class Malformed(StreamError):
    """A request or trailer field block HTTP/2 forbids: RST_STREAM with PROTOCOL_ERROR."""

    def __init__(self, message: str) -> None:
        super().__init__(message, PROTOCOL_ERROR)


class Request:
    """What the server needs of a request's fields (a plain class: a NamedTuple costs start-up time)."""

    __slots__ = ("method", "path", "content_type", "encoding", "content_length")

    def __init__(self, method: bytes, path: str, content_type: bytes, encoding: bytes,
                 content_length: int | None) -> None:
        self.method = method
        self.path = path
        self.content_type = content_type
        self.encoding = encoding  # grpc-encoding; b"" when absent
        self.content_length = content_length


_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
# section 8.2.2: fields that only mean something to one HTTP/1.1 hop
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                  b"upgrade"))
# section 8.2.1: a name is visible ASCII without uppercase; a colon only opens a pseudo-header's name
_NAME_BYTES = bytes(b for b in range(0x21, 0x7F) if not 0x41 <= b <= 0x5A and b != 0x3A)


def _check_name(name: bytes) -> None:
    if not name or name.translate(None, _NAME_BYTES):
        raise Malformed(f"invalid field name {name[:40]!r} (lowercase visible ASCII only)")


def _check_value(name: bytes, value: bytes) -> None:
    if b"\x00" in value or b"\n" in value or b"\r" in value or value[:1] in (b" ", b"\t") \
            or value[-1:] in (b" ", b"\t"):
        raise Malformed(f"invalid value of {name[:40]!r} (NUL, CR, LF or whitespace at an end)")


def _check_regular(name: bytes, value: bytes) -> None:
    _check_name(name)
    _check_value(name, value)
    if name in _CONNECTION_SPECIFIC:
        raise Malformed(f"connection-specific field {name.decode()!r} in HTTP/2")
    if name == b"te" and value != b"trailers":
        raise Malformed("te may only be 'trailers' in HTTP/2")


def parse_request(fields: list[tuple[bytes, bytes]]) -> Request:
    """The request a HEADERS block opens, or Malformed."""
    pseudo: dict[bytes, bytes] = {}
    regular = False
    content_type = encoding = b""
    length: int | None = None
    host: bytes | None = None
    for name, value in fields:
        if name[:1] == b":":
            if regular:
                raise Malformed(f"pseudo-header {name.decode(errors='replace')} after a regular field")
            if name not in _REQUEST_PSEUDO:
                raise Malformed(f"{name.decode(errors='replace')[:40]} is not a request pseudo-header")
            if name in pseudo:
                raise Malformed(f"{name.decode()} twice")
            _check_value(name, value)
            pseudo[name] = value
            continue
        regular = True
        _check_regular(name, value)
        if name == b"content-type":
            content_type = value
        elif name == b"grpc-encoding":
            encoding = value
        elif name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise Malformed(f"invalid content-length {value[:20]!r}")
            length = int(value)
        elif name == b"host":
            host = value
    method = pseudo.get(b":method")
    if method is None:
        raise Malformed("no :method")
    authority = pseudo.get(b":authority")
    if method == b"CONNECT":  # section 8.5: only :method and :authority
        if b":scheme" in pseudo or b":path" in pseudo or authority is None:
            raise Malformed("a CONNECT request has :authority and neither :scheme nor :path")
    elif b":scheme" not in pseudo or not pseudo.get(b":path"):
        raise Malformed("a request needs :scheme and a non-empty :path")
    if host is not None and authority is not None and host != authority:
        raise Malformed("host and :authority differ")
    return Request(method, pseudo.get(b":path", b"").decode("latin-1"), content_type, encoding, length)


def check_trailers(fields: list[tuple[bytes, bytes]]) -> None:
    """A request's trailer block: regular fields only (section 8.1)."""
    for name, value in fields:
        if name[:1] == b":":
            raise Malformed(f"pseudo-header {name.decode(errors='replace')[:40]} in trailers")
        _check_regular(name, value)
