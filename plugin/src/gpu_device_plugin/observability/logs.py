"""Logging that reads well in journald (priority prefixes) and on a terminal (timestamps)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

# Complaints about one request from a local client (a corrupt message, unknown IDs): whoever can
# reach the socket can send thousands, so they are one line each and rate-limited.
REQUESTS = "gpu_device_plugin.requests"
_MAX_LINE = 400  # a request with 100 000 unknown IDs still makes a short line

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


class JournalFormatter(logging.Formatter):
    """`<6>message`: journald turns the prefix into the entry's priority; it adds its own timestamp."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{_PRIORITY.get(record.levelno, 6)}>"
        return prefix + super().format(record).replace("\n", "\n" + prefix)


class RequestNoise(logging.Filter):
    """One line per bad-request record (gRPC's own tracebacks included), at most `burst` lines per
    `window_s`; the first line after a quiet spell says how many were left out."""

    def __init__(self, burst: int = 10, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._window_start = -window_s
        self._in_window = 0
        self._dropped = 0
        self._lock = threading.Lock()  # handlers run filters outside their own lock; gRPC threads log at once

    @staticmethod
    def applies(record: logging.LogRecord) -> bool:
        return record.name == REQUESTS or record.name == "grpc" or record.name.startswith("grpc.")

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.applies(record):
            return True
        with self._lock:
            now = self._clock()
            if now - self._window_start >= self.window_s:
                self._window_start, self._in_window = now, 0
            if self._in_window >= self.burst:
                self._dropped += 1
                return False
            self._in_window += 1
            dropped, self._dropped = self._dropped, 0
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text = f"{text} {type(exc).__name__}: {exc}"
        text = " ".join(text.split())  # one line, whatever the exception said
        if len(text) > _MAX_LINE:
            text = text[:_MAX_LINE] + "..."
        if dropped:
            text += f" ({dropped} similar lines left out)"
        record.msg, record.args = text, None
        record.exc_info = record.exc_text = record.stack_info = None
        return True


def setup(level: str = "info", stream: object = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.addFilter(RequestNoise())
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(logging.WARNING)
