"""HTTP/2 flow control on the receiving side (RFC 9113 section 5.2, 6.9): a window the peer
sends into, and credit given back in WINDOW_UPDATE frames. The window is flow control, not a
size limit: credit goes back as data is taken off the wire, so a message of any size allowed
gets through a window of any size."""

from __future__ import annotations


class ReceiveWindow:
    """What the peer may still send on a connection or stream, and credit not yet given back."""

    __slots__ = ("size", "left", "owed")

    def __init__(self, size: int) -> None:
        self.size = size  # the window we advertised
        self.left = size
        self.owed = 0

    def receive(self, length: int) -> int:
        """`length` bytes arrived (padding included) and may be sent again at once: the increment to
        give back now (0 while below half the window, so small frames cost few WINDOW_UPDATEs), or
        -1 when the peer overran the window."""
        left = self.left - length
        if left < 0:
            return -1
        owed = self.owed + length
        if owed >= self.size // 2:
            self.left, self.owed = left + owed, 0
            return owed
        self.left, self.owed = left, owed
        return 0
