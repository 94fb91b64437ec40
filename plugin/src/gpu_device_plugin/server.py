"""One gRPC server on one Unix socket, and the Register call to the kubelet."""

from __future__ import annotations

import os
import stat
from concurrent import futures

import grpc

from .api import pb, rpc
from .servicer import MAX_STREAMS, DevicePluginServicer

# ListAndWatch holds a worker per open stream; the kubelet keeps one. Streams are capped
# (servicer.StreamSlots, MAX_STREAMS) and the pool has room for them plus the unary calls,
# so Allocate, GetPreferredAllocation and the watchdog's self-probe always find a worker.
UNARY_WORKERS = 4
MAX_WORKERS = MAX_STREAMS + UNARY_WORKERS


class RegistrationError(Exception):
    pass


class PluginServer:
    def __init__(self, socket_path: str, servicer: DevicePluginServicer) -> None:
        self.socket_path = socket_path
        self.servicer = servicer
        self._server: grpc.Server | None = None
        self.inode: int | None = None

    def start(self) -> None:
        remove_socket(self.socket_path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="grpc"),
                             options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((rpc.generic_handler("DevicePlugin", self.servicer),))
        try:
            bound = server.add_insecure_port(f"unix:{self.socket_path}")
        except RuntimeError:  # newer grpcio raises, older ones return 0
            bound = 0
        if bound == 0:
            raise OSError(f"cannot bind {self.socket_path}: does the directory exist and is it writable?")
        server.start()
        self._server = server
        self.inode = os.stat(self.socket_path).st_ino

    def stop(self, remove: bool = True) -> None:
        self.servicer.stop()
        if self._server is not None:
            self._server.stop(grace=None).wait(2)
            self._server = None
        if remove:
            owned = self.owns_socket()
            if owned:
                remove_socket(self.socket_path)

    def owns_socket(self) -> bool:
        """Our socket file is still the one we bound (not deleted, not replaced)."""
        try:
            st = os.stat(self.socket_path)
        except OSError:
            return False
        return stat.S_ISSOCK(st.st_mode) and st.st_ino == self.inode


def remove_socket(path: str) -> None:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def register(kubelet_socket: str, endpoint: str, resource: str, timeout: float = 5.0) -> None:
    """Register with the kubelet, which dials our endpoint back before answering."""
    options = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
    request = pb.RegisterRequest(version=pb.VERSION, endpoint=endpoint, resource_name=resource, options=options)
    channel = grpc.insecure_channel(f"unix:{kubelet_socket}")
    try:
        rpc.Stub(channel, "Registration").Register(request, timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        raise RegistrationError(f"{getattr(code, 'name', code)}: {details}") from None
    finally:
        channel.close()
