"""The systemd watchdog's self-probe: does our own gRPC server still answer on its socket?"""

from __future__ import annotations

import logging

from ..api import grpc_client
from ..api.status import RpcFailure
from ..service.server import method_path

log = logging.getLogger(__name__)


class SelfProbe:
    """GetDevicePluginOptions on our socket; a wedged server loop shows up as a timeout."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout

    def answers(self, server: object, socket_path: str) -> bool:
        try:
            grpc_client.call(socket_path, method_path("DevicePlugin", "GetDevicePluginOptions"), b"", self.timeout)
            return True
        except RpcFailure as failure:
            log.error("self-check: our gRPC server did not answer (%s)", failure.code.name)
            return False

    def close(self) -> None:
        """Nothing held between probes (each uses a fresh connection)."""
