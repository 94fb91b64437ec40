"""systemd readiness and watchdog notifications (sd_notify protocol, no libsystemd needed)."""

from __future__ import annotations

import os
import socket


def notify(message: str, environ: dict[str, str] | None = None) -> bool:
    """Send `message` (e.g. "READY=1") to $NOTIFY_SOCKET; False when not under systemd."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message.encode(), address)
        return True
    except OSError:
        return False


def watchdog_interval(environ: dict[str, str] | None = None) -> float | None:
    """Seconds between pings (half of WATCHDOG_USEC), or None when the watchdog is off or not ours."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000
