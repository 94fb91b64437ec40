"""A small inotify binding over ctypes: watch directories, read what changed.

Linux only. The descriptor is non-blocking: `read_events()` returns [] when nothing is
pending, and callers wait on `fileno()` with select/poll, so a watch costs no CPU while idle.
"""

import ctypes
import errno
import os
import struct
from typing import NamedTuple

# Event bits, from <sys/inotify.h>.
IN_ACCESS = 0x00000001
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_CLOSE_NOWRITE = 0x00000010
IN_OPEN = 0x00000020
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
# Bits the kernel sets in events it reports.
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000  # events were dropped: rescan whatever you watch
IN_IGNORED = 0x00008000  # the watch is gone (its directory was deleted or unmounted)
IN_ISDIR = 0x40000000
# Flags for add_watch.
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_MASK_ADD = 0x20000000

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = 0o2000000  # O_CLOEXEC on every Linux architecture we ship for

_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event without the name)
_READ_SIZE = 64 * 1024  # holds hundreds of events; the kernel never splits one across reads


class Event(NamedTuple):
    wd: int  # the watch descriptor add_watch returned (-1 for IN_Q_OVERFLOW)
    mask: int
    name: str  # entry name inside the watched directory; "" for events on the directory itself
    cookie: int = 0  # pairs IN_MOVED_FROM with IN_MOVED_TO


def _libc() -> ctypes.CDLL:
    # The running interpreter already links libc: CDLL(None) finds its symbols without
    # find_library(), which spawns ldconfig and cost ~40 ms at every start.
    return ctypes.CDLL(None, use_errno=True)


class Inotify:
    """One inotify instance. Close it (or use it as a context manager) to free the descriptor."""

    def __init__(self) -> None:
        try:
            libc = _libc()
            init1 = libc.inotify_init1
            self._add = libc.inotify_add_watch
            self._rm = libc.inotify_rm_watch
        except (OSError, AttributeError) as exc:
            raise OSError(errno.ENOSYS, f"inotify is not available here (Linux only): {exc}") from None
        init1.argtypes = [ctypes.c_int]
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            hint = " (raise fs.inotify.max_user_instances)" if err == errno.EMFILE else ""
            raise OSError(err, f"inotify_init1 failed: {os.strerror(err)}{hint}")
        self._fd = fd

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("inotify instance is closed")
        return self._fd

    def add_watch(self, path: str, mask: int) -> int:
        """Watch `path` for `mask` events; returns the watch descriptor (same path, same wd)."""
        wd = self._add(self.fileno(), os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            hint = " (raise fs.inotify.max_user_watches)" if err == errno.ENOSPC else ""
            raise OSError(err, f"cannot watch {path}: {os.strerror(err)}{hint}", path)
        return wd

    def rm_watch(self, wd: int) -> None:
        if self._rm(self.fileno(), wd) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot remove inotify watch {wd}: {os.strerror(err)}")

    def read_events(self) -> list[Event]:
        """Every event pending now; [] when there is none (never blocks)."""
        try:
            data = os.read(self.fileno(), _READ_SIZE)
        except BlockingIOError:
            return []
        return parse_events(data)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> "Inotify":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def parse_events(data: bytes) -> list[Event]:
    """Decode a buffer of struct inotify_event records (names are NUL-padded)."""
    events: list[Event] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, cookie, length = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        raw_name = data[offset : offset + length]
        offset += length
        events.append(Event(wd, mask, os.fsdecode(raw_name.split(b"\0", 1)[0]), cookie))
    return events
