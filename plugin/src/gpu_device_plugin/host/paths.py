"""Paths on the host whose / may be mounted elsewhere (--host-root), checked as the host sees them."""

from __future__ import annotations

import os
import stat


def host_path_exists(root: str, path: str) -> bool:
    """Whether `path` exists on the host whose / is mounted at `root`.

    Symlinks are resolved inside `root`: L4T's are often absolute (/usr/local/cuda ->
    /etc/alternatives/cuda), and following them from the plugin's own / would check the
    wrong file when the plugin runs in a container with the host at /host.
    """
    if root in ("", "/"):
        return os.path.exists(path)
    root = os.path.abspath(root)
    pending = [p for p in path.split("/") if p]
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        try:  # one lstat per component: it both tells a link and proves the name exists
            is_link = stat.S_ISLNK(os.lstat(candidate).st_mode)
        except OSError:
            return False
        if is_link:
            hops += 1
            if hops > 40:  # the kernel's own limit on links in one lookup (ELOOP)
                return False
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            pending = [p for p in target.split("/") if p] + pending
            continue
        resolved.append(part)
    return True


def remove_socket(path: str) -> None:
    """Remove a socket left at `path` (a crashed run's); anything else there is left alone."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def is_socket_bound_as(path: str, inode: int | None) -> bool:
    """`path` is still the socket we bound (its inode then): not deleted, not replaced by another
    process's socket, which stopping must then leave alone."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and st.st_ino == inode
