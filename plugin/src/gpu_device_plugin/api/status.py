"""gRPC status codes (the wire numbers) and the failure a handler or a call raises."""

from __future__ import annotations

import re
from enum import IntEnum


class StatusCode(IntEnum):
    """All of gRPC's codes: a peer (the kubelet's PodResources service) may answer any of them."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcFailure(Exception):
    """A call that ended with a status other than OK."""

    def __init__(self, code: StatusCode, details: str = "") -> None:
        super().__init__(f"{code.name}: {details}" if details else code.name)
        self.code = code
        self.details = details


def status_code(value: bytes | str | None) -> StatusCode:
    """A grpc-status header's value; unknown or missing numbers are UNKNOWN, as gRPC says."""
    try:
        return StatusCode(int(value)) if value is not None else StatusCode.UNKNOWN
    except ValueError:
        return StatusCode.UNKNOWN


# grpc-message is percent-encoded UTF-8: every byte outside printable ASCII, and % itself
def encode_message(details: str) -> bytes:
    return b"".join(b"%%%02X" % byte if byte < 0x20 or byte > 0x7E or byte == 0x25 else bytes((byte,))
                    for byte in details.encode())


_ESCAPE = rb"%([0-9A-Fa-f]{2})"  # compiled on first use (re caches)


def decode_message(value: bytes) -> str:
    return re.sub(_ESCAPE, lambda m: bytes((int(m.group(1), 16),)), value).decode("utf-8", "replace")
