"""One gRPC server on one Unix socket that knows whether the socket file is still its own: the kubelet,
or a person, may delete it, and the daemon then serves a fresh one."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from ..api.grpc_server import Method, Server
from ..host.paths import is_socket_bound_as, remove_socket

log = logging.getLogger(__name__)


class SocketServer:
    def __init__(self, path: str, methods: Mapping[str, Method]) -> None:
        self.path = path
        self.methods = methods
        self.server: Server | None = None
        self.starts = 0  # how often it was served (again), for logs and tests
        self._inode: int | None = None

    def start(self) -> None:
        """Serve on a fresh socket (a stale one removed first); OSError naming the path and the fix."""
        self.stop()
        os.makedirs(os.path.dirname(self.path), mode=0o750, exist_ok=True)
        remove_socket(self.path)
        server = Server(self.methods, log)
        try:
            server.bind(self.path)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {self.path} ({exc.strerror or exc}): check the directory "
                          "exists, is writable and the path is under 108 bytes") from None
        server.start()
        self.server = server
        self.starts += 1
        self._inode = os.stat(self.path).st_ino

    def owns_socket(self) -> bool:
        return is_socket_bound_as(self.path, self._inode)

    def wake(self) -> None:
        if self.server is not None:
            self.server.wake()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(2)
            self.server = None
            if self.owns_socket():
                remove_socket(self.path)
