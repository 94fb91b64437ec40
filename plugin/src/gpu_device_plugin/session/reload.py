"""A configuration change while running: SIGHUP, or the config file written anew.

The settings are loaded the way a start loads them; reload_policy decides what may change
live; an accepted change is handed to `apply`. A file that does not load, or a change that
cannot be made, is rejected with its reason and the last good configuration stays in force.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from ..config.settings import ConfigError, Settings
from ..host import inotify
from ..observability.stats import Stats
from . import dir_events

log = logging.getLogger(__name__)


class ConfigReload:
    def __init__(self, load: Callable[[], Settings] | None, current: Callable[[], Settings],
                 apply: Callable[[Settings, Sequence[str]], None], backend: str | None, stats: Stats) -> None:
        self._load = load  # None: nothing to reload from (tests, a plugin run without a config source)
        self._current = current
        self._apply = apply
        self._backend = backend  # the discovery backend serving; a reload may not switch it
        self._stats = stats
        self._requested = threading.Event()
        self.config_wd: int | None = None

    @property
    def enabled(self) -> bool:
        return self._load is not None

    def watch(self, watcher: inotify.Inotify, config_file: str) -> None:
        """Reload when `config_file` is written (a ConfigMap's ..data swap included)."""
        if config_file and self._load is not None:
            self.config_wd = dir_events.watch_config(watcher, config_file)

    def request(self) -> None:
        """Ask for a reload (any thread); the daemon's loop runs it."""
        self._requested.set()

    def run_if_requested(self) -> None:
        if self._requested.is_set():
            self._requested.clear()
            self._reload()

    def _reload(self) -> None:
        if self._load is None:
            return
        try:
            new = self._load()
        except Exception as exc:
            self._reject(exc if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}")
            return
        from ..config.reload_policy import plan  # only on a reload: start-up time

        decided = plan(self._current(), new, self._backend)
        if decided.rejection:
            self._reject(decided.rejection)
        elif decided.settings is not None:
            self._apply(decided.settings, decided.kept)

    def _reject(self, reason: object) -> None:
        self._stats.add("config_rejections")
        log.error("configuration change rejected, keeping the last good one: %s", reason)
