"""Which kubelet we registered with: a restarted kubelet re-creates kubelet.sock."""

from __future__ import annotations

import os

Identity = tuple[int, int]


def identity(path: str) -> Identity | None:
    """Which socket file this is: a re-created kubelet.sock differs in inode or change time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)
