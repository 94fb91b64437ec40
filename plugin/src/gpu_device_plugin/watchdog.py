"""The systemd watchdog's self-probe: does our own gRPC server still answer on its socket?"""

from __future__ import annotations

import logging

import grpc

from .api import pb, rpc

log = logging.getLogger(__name__)


class SelfProbe:
    """One channel per server instance, so a wedged thread pool shows up as a timeout."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self._channel: grpc.Channel | None = None
        self._server: object | None = None  # the server the channel was made for

    def answers(self, server: object, socket_path: str) -> bool:
        # a new server means a new socket: an old channel may sit in reconnect back-off
        if self._server is not server or self._channel is None:
            self.close()
            self._channel = grpc.insecure_channel(f"unix:{socket_path}")
            self._server = server
        try:
            rpc.Stub(self._channel, "DevicePlugin").GetDevicePluginOptions(pb.Empty(), timeout=self.timeout)
            return True
        except grpc.RpcError as exc:
            log.error("self-check: our gRPC server did not answer (%s)", exc.code() if hasattr(exc, "code") else exc)
            return False

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._server = None
