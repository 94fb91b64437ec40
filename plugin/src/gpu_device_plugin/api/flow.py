"""HTTP/2 flow control on the receiving side (RFC 9113 section 5.2, 6.9): a window the peer
sends into, and credit given back in WINDOW_UPDATE frames. The window is flow control, not a
size limit: credit goes back as data is taken off the wire, so a message of any size allowed
gets through a window of any size."""

from __future__ import annotations

from . import h2


class ReceiveWindow:
    """What the peer may still send on a connection or stream, and credit not yet given back."""

    __slots__ = ("size", "left", "owed")

    def __init__(self, size: int) -> None:
        self.size = size  # the window we advertised
        self.left = size
        self.owed = 0

    def take(self, length: int) -> bool:
        """`length` bytes arrived (padding included); False when the peer overran the window."""
        self.left -= length
        return self.left >= 0

    def credit(self, length: int) -> int:
        """`length` bytes may be sent again: the increment to send now (0 while below half the window,
        so a stream of small frames costs few WINDOW_UPDATEs)."""
        self.owed += length
        if self.owed >= self.size // 2:
            increment, self.owed = self.owed, 0
            self.left += increment
            return increment
        return 0


def window_update(stream_id: int, increment: int) -> bytes:
    return h2.window_update(stream_id, increment) if increment else b""
