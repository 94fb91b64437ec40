"""Retry delays that double from `first` to `maximum`, and when the next attempt is due."""

from __future__ import annotations

import time
from collections.abc import Callable


class Backoff:
    def __init__(self, first: float, maximum: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.first = first
        self.maximum = maximum
        self._clock = clock
        self._delay = first
        self.due_at: float | None = None  # when the scheduled retry is due; None when none is

    def schedule(self) -> float:
        """Schedule the next attempt; returns its delay (each one twice the last, up to the maximum)."""
        delay = self._delay
        self.due_at = self._clock() + delay
        self._delay = min(delay * 2, self.maximum)
        return delay

    def due(self) -> bool:
        return self.due_at is not None and self._clock() >= self.due_at

    def cancel(self) -> None:
        self.due_at = None

    def reset(self) -> None:
        """Success (or a fresh start): the next failure waits `first` again."""
        self._delay = self.first
