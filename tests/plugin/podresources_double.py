"""The kubelet's PodResources service (v1 List) on a Unix socket, served by grpcio, and two
kubelets that misbehave: one whose List hangs until the test releases it (`hang()`), and one
that answers every connection with a malformed GOAWAY frame (`GoawayKubelet`, raw HTTP/2).

Its messages are declared here in full, independently of the plugin's api/podresources.py,
field numbers from k8s.io/kubelet/pkg/apis/podresources/v1/api.proto: the fields the plugin
does not declare (cpu_ids, packed as proto3 packs repeated scalars; memory with its
topology; dynamic_resources) are filled in, so a test proves the plugin reads around them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Sequence
from concurrent import futures
from typing import Any, NamedTuple

import grpc
from h2_peer import DATA, END_STREAM, GOAWAY, PREFACE, frame, settings

STRING, INT64, UINT64, MESSAGE = 9, 3, 4, 11  # FieldDescriptorProto types
OPTIONAL, REPEATED = 1, 3
PACKAGE = "v1"

MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, MESSAGE, REPEATED, "PodResources")],
    "PodResources": [("name", 1, STRING, OPTIONAL, ""), ("namespace", 2, STRING, OPTIONAL, ""),
                     ("containers", 3, MESSAGE, REPEATED, "ContainerResources")],
    "ContainerResources": [("name", 1, STRING, OPTIONAL, ""), ("devices", 2, MESSAGE, REPEATED, "ContainerDevices"),
                           ("cpu_ids", 3, INT64, REPEATED, ""), ("memory", 4, MESSAGE, REPEATED, "ContainerMemory"),
                           ("dynamic_resources", 5, MESSAGE, REPEATED, "DynamicResource")],
    "ContainerMemory": [("memory_type", 1, STRING, OPTIONAL, ""), ("size", 2, UINT64, OPTIONAL, ""),
                        ("topology", 3, MESSAGE, OPTIONAL, "TopologyInfo")],
    "TopologyInfo": [("nodes", 1, MESSAGE, REPEATED, "NUMANode")],
    "NUMANode": [("ID", 1, INT64, OPTIONAL, "")],
    "ContainerDevices": [("resource_name", 1, STRING, OPTIONAL, ""), ("device_ids", 2, STRING, REPEATED, ""),
                         ("topology", 3, MESSAGE, OPTIONAL, "TopologyInfo")],
    "DynamicResource": [("claim_name", 2, STRING, OPTIONAL, ""), ("claim_namespace", 3, STRING, OPTIONAL, "")],
}


def _classes() -> dict[str, Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="tests/podresources_v1.proto", package=PACKAGE, syntax="proto3")
    for name, fields in MESSAGES.items():
        message = fdp.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(fdp.SerializeToString())
    get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22
    factory = None if get_class is not None else message_factory.MessageFactory()
    return {name: (get_class or factory.GetPrototype)(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
            for name in MESSAGES}


CLASSES = _classes()


class Container(NamedTuple):
    name: str
    devices: dict[str, Sequence[str]]  # resource name -> device IDs


class Pod(NamedTuple):
    name: str
    namespace: str
    containers: Sequence[Container]


def list_response(pods: Sequence[Pod]) -> Any:
    response = CLASSES["ListPodResourcesResponse"]()
    for pod in pods:
        message = response.pod_resources.add(name=pod.name, namespace=pod.namespace)
        for container in pod.containers:
            entry = message.containers.add(name=container.name, cpu_ids=[2, 3])
            entry.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
            entry.dynamic_resources.add(claim_name="unrelated", claim_namespace=pod.namespace)
            for resource, ids in container.devices.items():
                devices = entry.devices.add(resource_name=resource, device_ids=list(ids))
                devices.topology.nodes.add(ID=0)
    return response


class PodResourcesDouble:
    """Serve List at `socket_path` (the kubelet's is <kubelet root>/pod-resources/kubelet.sock)."""

    def __init__(self, socket_path: str, pods: Sequence[Pod] = ()) -> None:
        self.socket_path = socket_path
        self.pods = list(pods)
        self.fail_with: grpc.StatusCode | None = None
        self.calls = 0
        self.in_list = 0  # calls inside List now (a hung one stays counted until released)
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._released.set()
        self._server: grpc.Server | None = None

    def hang(self) -> None:
        """From now on List blocks, as a wedged kubelet's does, until release()."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            self.calls += 1
            self.in_list += 1
        try:
            self._released.wait()
        finally:
            with self._lock:
                self.in_list -= 1
        if self.fail_with is not None:
            context.abort(self.fail_with, "refused by the test")
        return list_response(self.pods)

    def start(self) -> PodResourcesDouble:
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        handler = grpc.method_handlers_generic_handler(f"{PACKAGE}.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self.List, request_deserializer=CLASSES["ListPodResourcesRequest"].FromString,
                response_serializer=CLASSES["ListPodResourcesResponse"].SerializeToString)})
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.stop(None).wait(2)
            self._server = None


class GoawayKubelet:
    """A kubelet socket whose server reads the client's request and answers with its SETTINGS and
    a GOAWAY of three bytes (RFC 9113 6.8 wants at least eight): a transport error mid-call."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.connections = 0
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> GoawayKubelet:
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self._listener.bind(self.socket_path)
        self._listener.listen(4)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed by stop()
                return
            with conn:
                self.connections += 1
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    self._read_call(conn)
                    conn.sendall(settings() + frame(GOAWAY, 0, 0, b"\x00\x00\x01"))
                    while conn.recv(65536):  # until the client hangs up, so it reads all of the above
                        pass

    @staticmethod
    def _read_call(conn: socket.socket) -> None:
        """The preface and frames up to the request's END_STREAM (DATA, type 0, flag 1)."""
        buf = bytearray()
        while len(buf) < len(PREFACE):
            buf += conn.recv(65536) or b"x" * len(PREFACE)
        del buf[:len(PREFACE)]
        while True:
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                length, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                del buf[:9 + length]
                if kind == DATA and flags & END_STREAM:
                    return
            data = conn.recv(65536)
            if not data:
                return
            buf += data

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
