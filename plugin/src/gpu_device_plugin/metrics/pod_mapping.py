"""Which containers hold which GPU, kept fresh without a scrape ever waiting on a stuck kubelet.

A scrape asks `PodMapping.view()`: it gets the last mapping the kubelet gave at once, and,
when that is older than `max_age`, a fresh read starts on a thread of its own (never under a
lock a scrape needs). While the kubelet has been answering, the scrape waits up to `wait`
seconds for that read, so a healthy node's labels are fresh. Once a read fails or outlasts
`wait` (a hung kubelet), scrapes stop waiting: they serve the last mapping, its age and the
error, and reads back off (1, 2, 4 ... 60 s) until one succeeds. Any failure counts, a
transport error in the kubelet's answer included: only the pod labels may go stale, never
the GPU series.

Nothing runs between scrapes: a read starts only when a scrape asks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from .attribution import Holder

log = logging.getLogger(__name__)

Holders = Mapping[str, Sequence[Holder]]
MAX_AGE_S = 1.0  # a mapping younger than this is reused (scrapes of two Prometheus servers)
WAIT_S = 0.5  # how long a scrape waits for a read while the kubelet answers
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0


class NoKubelet(Exception):
    """Nothing serves PodResources here (no socket): not worth a warning, still no answer."""


class PodView(NamedTuple):
    holders: Holders  # GPU ID -> containers holding it, from the last answer (empty before one)
    age: float | None  # seconds since the kubelet gave that answer; None: it never answered
    error: str = ""  # why the last read failed ("" while the kubelet answers)

    @property
    def answering(self) -> bool:
        return not self.error


def backoff(failures: int) -> float:
    """Seconds to wait before the next read after `failures` failures in a row."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, failures - 1))


class PodMapping:
    def __init__(self, read: Callable[[], Holders], *, max_age: float = MAX_AGE_S, wait: float = WAIT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._max_age = max_age
        self._wait = wait
        self._clock = clock
        self._lock = threading.Lock()  # guards the fields below, never held across a read
        self._holders: Holders = {}
        self._read_at: float | None = None
        self._error = ""
        self._failures = 0
        self._next_try = float("-inf")
        self._done: threading.Event | None = None  # set when the read in flight ends
        self._started = 0.0  # when the read in flight began
        self._responsive = True  # the last read answered in time: scrapes may wait for the next

    def view(self) -> PodView:
        with self._lock:
            done = self._done
            if done is None and self._due(self._clock()):
                done = self._done = threading.Event()
                self._started = self._clock()
                threading.Thread(target=self._refresh, args=(done,), name="pod-resources", daemon=True).start()
            wait = done is not None and self._responsive
        if wait and done is not None and not done.wait(self._wait):
            with self._lock:
                self._responsive = False  # hung: later scrapes serve the last mapping at once
        with self._lock:
            now = self._clock()
            age = None if self._read_at is None else max(0.0, now - self._read_at)
            error = self._error
            if not error and self._done is not None and not self._responsive:
                error = f"PodResources List unanswered for {now - self._started:.1f} s"
            return PodView(self._holders, age, error)

    @property
    def reading(self) -> bool:
        """A read of the kubelet is in flight."""
        with self._lock:
            return self._done is not None

    @property
    def failures(self) -> int:
        """Reads failed in a row (0 while the kubelet answers)."""
        with self._lock:
            return self._failures

    def _due(self, now: float) -> bool:
        if now < self._next_try:
            return False
        return self._read_at is None or self._error != "" or now - self._read_at >= self._max_age

    def _refresh(self, done: threading.Event) -> None:
        try:
            holders, error, quiet = self._read(), "", False
        except NoKubelet as exc:
            holders, error, quiet = None, str(exc), True
        except Exception as exc:  # any failure of the kubelet's answer: labels go stale, series stay
            holders, error, quiet = None, str(exc) or type(exc).__name__, False
        with self._lock:
            now = self._clock()
            if holders is not None:
                if self._error:
                    log.info("the kubelet's PodResources service answers again: GPU metrics carry current pod labels")
                self._holders, self._read_at, self._error, self._failures = holders, now, "", 0
                self._next_try = float("-inf")
                self._responsive = True
            else:
                if error != self._error and not quiet:  # once per new failure, not per scrape
                    log.warning("GPU metrics keep the last pod labels: the kubelet's PodResources service did "
                                "not answer (%s)", error)
                self._error = error
                self._failures += 1
                self._next_try = now + backoff(self._failures)
                self._responsive = False
            self._done = None
        done.set()
