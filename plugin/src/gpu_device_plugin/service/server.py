"""One gRPC server on one Unix socket, and the Register call to the kubelet."""

from __future__ import annotations

import os

from ..api import grpc_client, wire
from ..api.grpc_server import Method, Server
from ..api.schema import PACKAGE, SERVICES, VERSION
from ..api.status import RpcFailure
from ..host.paths import is_socket_bound_as, remove_socket
from .servicer import DevicePluginServicer, request_log


class RegistrationError(Exception):
    pass


def method_path(service: str, method: str) -> str:
    return f"/{PACKAGE}.{service}/{method}"


def device_plugin_methods(servicer: DevicePluginServicer) -> dict[str, Method]:
    """The DevicePlugin service's paths, each to its request class and servicer method."""
    return {method_path("DevicePlugin", name): Method(wire.CLASSES[request], getattr(servicer, name), streaming)
            for name, request, _response, streaming in SERVICES["DevicePlugin"]}


class PluginServer:
    def __init__(self, socket_path: str, servicer: DevicePluginServicer) -> None:
        self.socket_path = socket_path
        self.servicer = servicer
        self._server: Server | None = None
        self.inode: int | None = None

    def start(self) -> None:
        remove_socket(self.socket_path)
        server = Server(device_plugin_methods(self.servicer), request_log)
        try:
            server.bind(self.socket_path)
        except OSError as exc:
            raise OSError(f"cannot bind {self.socket_path} ({exc.strerror or exc}): does the directory exist "
                          "and is it writable?") from None
        self.servicer.attach(server.wake)
        self.servicer.warm_up()
        server.start()
        self._server = server
        self.inode = os.stat(self.socket_path).st_ino

    def stop(self, remove: bool = True) -> None:
        self.servicer.stop()
        if self._server is not None:
            self._server.stop(2)
            self.servicer.detach(self._server.wake)
            self._server = None
        if remove:
            owned = self.owns_socket()
            if owned:
                remove_socket(self.socket_path)

    def owns_socket(self) -> bool:
        """Our socket file is still the one we bound (not deleted, not replaced)."""
        return is_socket_bound_as(self.socket_path, self.inode)


def register(kubelet_socket: str, endpoint: str, resource: str, timeout: float = 5.0) -> None:
    """Register with the kubelet, which dials our endpoint back before answering."""
    options = wire.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
    request = wire.RegisterRequest(version=VERSION, endpoint=endpoint, resource_name=resource, options=options)
    try:
        grpc_client.call(kubelet_socket, method_path("Registration", "Register"), request.SerializeToString(),
                         timeout)
    except RpcFailure as failure:
        raise RegistrationError(f"{failure.code.name}: {failure.details}") from None
