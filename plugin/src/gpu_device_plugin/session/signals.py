"""Signal handlers for the length of a run, and the previous ones back before its resources go."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Mapping


@contextlib.contextmanager
def handled(handlers: Mapping[signal.Signals, Callable[[], None]]) -> Iterator[None]:
    """Install `handlers` (main thread only; elsewhere nothing happens) and restore the old ones on exit.

    Callers close what the handlers write to (the wake pipe) only after this exits, so a
    signal arriving after the run never reaches a closed descriptor."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in handlers}
    try:
        for sig, action in handlers.items():
            signal.signal(sig, lambda _signum, _frame, act=action: act())
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
