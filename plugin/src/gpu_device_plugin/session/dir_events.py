"""What the session watches with inotify, and what the events mean. Pure apart from `watch_config`.

The socket directory tells us when the kubelet (re)starts (kubelet.sock created) and when
our own socket is deleted (the kubelet wipes the directory when it restarts); the config
file's directory tells us when the file was replaced. A queue overflow loses events of
both, so it asks for every re-check.
"""

import logging
import os
from collections.abc import Sequence
from typing import NamedTuple

from ..host import inotify

log = logging.getLogger(__name__)

DIR_EVENTS = inotify.IN_CREATE | inotify.IN_DELETE | inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO
# Not IN_CREATE: a file is complete only when its writer closes it or it is renamed into place.
FILE_EVENTS = inotify.IN_CLOSE_WRITE | inotify.IN_MOVED_TO


class Watches(NamedTuple):
    socket_wd: int | None
    config_wd: int | None
    kubelet_name: str  # kubelet.sock
    endpoint_name: str  # our socket, e.g. nvidia-gpu.sock
    config_name: str | None  # the config file's name in its directory


class Seen(NamedTuple):
    """What a batch of events asks the session to do."""

    resync: bool = False  # events were lost or the socket directory went: re-check from the files
    kubelet_started: bool = False
    endpoint_deleted: bool = False  # our socket file went (the caller checks it is really not ours)
    reload: bool = False  # the config file may have changed


def classify(events: Sequence[inotify.Event], watches: Watches) -> Seen:
    resync = kubelet_started = endpoint_deleted = reload = False
    for event in events:
        if event.mask & inotify.IN_Q_OVERFLOW:
            resync = reload = True  # lost events may have been either kind
            continue
        if event.wd == watches.socket_wd:
            if event.mask & inotify.IN_IGNORED:
                resync = True  # the directory itself went away
            elif event.name == watches.kubelet_name and event.mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO):
                kubelet_started = True
            elif event.name == watches.endpoint_name and event.mask & (inotify.IN_DELETE | inotify.IN_MOVED_FROM):
                endpoint_deleted = True
        # ConfigMap volumes swap a `..data` symlink instead of touching the file itself
        if (watches.config_wd is not None and event.wd == watches.config_wd and event.mask & FILE_EVENTS
                and (event.name == watches.config_name or event.name.startswith(".."))):
            reload = True
    return Seen(resync, kubelet_started, endpoint_deleted, reload)


def watch_config(watcher: inotify.Inotify, path: str) -> int | None:
    """Watch the config file's directory (editors and ConfigMap updates replace the file); None if we cannot."""
    try:
        # IN_MASK_ADD: when the config shares the socket directory, keep that watch's events too
        return watcher.add_watch(os.path.dirname(os.path.abspath(path)), FILE_EVENTS | inotify.IN_MASK_ADD)
    except OSError as exc:
        log.warning("cannot watch %s for changes (%s); reload with SIGHUP", path, exc)
        return None
