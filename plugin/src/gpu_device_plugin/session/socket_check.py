"""Can we listen on this Unix socket path at all? Checked once at start, so a setting that
can never work exits with its reason instead of retrying the bind forever."""

from __future__ import annotations

import os
from collections.abc import Callable

# sockaddr_un.sun_path is 108 bytes on Linux, one of them the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


def socket_path_problem(path: str, access: Callable[[str, int], bool] = os.access) -> str:
    """Why `path` can never be bound (empty when it can be tried). The directory must exist."""
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH_BYTES:
        return (f"socket path {path} is {size} bytes, over the Unix limit of {MAX_SOCKET_PATH_BYTES}: "
                "choose a shorter --kubelet-socket directory")
    directory = os.path.dirname(path) or "."
    # os.access also answers False for root on a read-only filesystem (EROFS)
    if not access(directory, os.W_OK | os.X_OK):
        return (f"cannot create sockets in {directory} (not writable by this user or read-only): "
                "check --kubelet-socket and that the plugin runs as root")
    return ""
