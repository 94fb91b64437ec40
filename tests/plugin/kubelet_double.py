"""A kubelet device-manager double: the Registration server plus the plugin client.

It behaves like the real device manager where the plugin can tell: it checks the version
and resource name, dials the plugin's socket back *inside* Register (so a plugin that
registers before serving fails), reads options, runs ListAndWatch in a thread, and on
restart deletes every socket in its directory before re-creating kubelet.sock.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from gpu_device_plugin.api import pb, rpc

RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class Insufficient(Exception):
    """What the scheduler/kubelet says when no healthy, free device is left."""


class PluginEndpoint:
    """The kubelet's view of one registered plugin."""

    def __init__(self, socket_path: str, resource: str) -> None:
        self.socket_path = socket_path
        self.resource = resource
        self.channel = grpc.insecure_channel(f"unix:{socket_path}")
        grpc.channel_ready_future(self.channel).result(timeout=10)  # the kubelet's blocking dial
        self.stub = rpc.Stub(self.channel, "DevicePlugin")
        self.options = self.stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        self.updates: list[dict[str, str]] = []  # each ListAndWatch response: id -> health
        self.update_times: list[float] = []
        self.stream_ended = threading.Event()
        self._cond = threading.Condition()
        self.in_use: set[str] = set()  # device IDs allocated to admitted containers
        self._stream = self.stub.ListAndWatch(pb.Empty())
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            for response in self._stream:
                with self._cond:
                    self.updates.append({d.ID: d.health for d in response.devices})
                    self.update_times.append(time.monotonic())
                    self._cond.notify_all()
        except grpc.RpcError:
            pass
        finally:
            self.stream_ended.set()
            with self._cond:
                self._cond.notify_all()

    def devices(self) -> dict[str, str]:
        with self._cond:
            return dict(self.updates[-1]) if self.updates else {}

    def wait_for(self, predicate: Callable[[dict[str, str]], bool], timeout: float = 15.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (self.updates and predicate(self.updates[-1])):
                left = deadline - time.monotonic()
                if left <= 0 or (self.stream_ended.is_set() and not self.updates):
                    raise AssertionError(f"ListAndWatch never satisfied the condition; last: "
                                         f"{self.updates[-1] if self.updates else None}")
                self._cond.wait(left)
            return dict(self.updates[-1])

    def healthy(self) -> list[str]:
        return sorted(i for i, h in self.devices().items() if h == pb.HEALTHY)

    def allocate(self, *containers: list[str]) -> Any:
        request = pb.AllocateRequest()
        for ids in containers:
            request.container_requests.add(devices_ids=ids)
        return self.stub.Allocate(request, timeout=5)

    def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        request = pb.PreferredAllocationRequest()
        request.container_requests.add(available_deviceIDs=available, must_include_deviceIDs=must_include,
                                       allocation_size=size)
        return list(self.stub.GetPreferredAllocation(request, timeout=5).container_responses[0].deviceIDs)

    def admit(self, count: int) -> tuple[list[str], Any]:
        """Admit a container asking for `count` devices, as the device manager does.

        available = healthy - in use; ask GetPreferredAllocation only if the plugin offers it and
        treat the answer as a hint; then one Allocate call for this container.
        """
        available = sorted(i for i, h in self.devices().items() if h == pb.HEALTHY and i not in self.in_use)
        if len(available) < count:
            raise Insufficient(f"Insufficient {self.resource}: {len(available)} free, {count} requested")
        chosen: list[str] = []
        if self.options.get_preferred_allocation_available:
            chosen = [i for i in self.preferred(available, [], count) if i in available][:count]
        chosen += [i for i in available if i not in chosen][: count - len(chosen)]
        response = self.allocate(chosen)
        self.in_use.update(chosen)
        return chosen, response.container_responses[0]

    def release(self, ids: list[str]) -> None:
        self.in_use.difference_update(ids)

    def close(self) -> None:
        self._stream.cancel()
        self.channel.close()


class KubeletDouble:
    def __init__(self, socket_dir: str) -> None:
        self.socket_dir = socket_dir
        self.socket_path = os.path.join(socket_dir, "kubelet.sock")
        self.registrations: list[tuple[str, str, float]] = []  # (resource, endpoint, time)
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.registered = threading.Condition()
        self.reject_with: grpc.StatusCode | None = None
        self._server: grpc.Server | None = None

    # Registration service
    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self.reject_with is not None:
            context.abort(self.reject_with, "rejected by test")
        if request.version != pb.VERSION:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        if not RESOURCE_RE.match(request.resource_name) or request.resource_name.startswith("kubernetes.io/"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid resource name {request.resource_name}")
        socket_path = os.path.join(self.socket_dir, request.endpoint)
        try:
            endpoint = PluginEndpoint(socket_path, request.resource_name)
        except Exception as exc:
            context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {exc}")
        old = self.endpoints.get(request.resource_name)
        if old is not None:
            old.close()
        with self.registered:
            self.endpoints[request.resource_name] = endpoint
            self.registrations.append((request.resource_name, request.endpoint, time.monotonic()))
            self.registered.notify_all()
        return pb.Empty()

    def start(self, cleanup: bool = True) -> None:
        os.makedirs(self.socket_dir, exist_ok=True)
        if cleanup:
            self.cleanup_plugin_directory()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((rpc.generic_handler("Registration", self),))
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(None).wait(2)
            self._server = None
        for endpoint in self.endpoints.values():
            endpoint.close()
        self.endpoints.clear()

    def restart(self) -> None:
        """As the kubelet restarts: gone, every socket in the directory deleted, then back."""
        self.stop()
        self.start(cleanup=True)

    def cleanup_plugin_directory(self) -> None:
        for name in os.listdir(self.socket_dir):
            path = os.path.join(self.socket_dir, name)
            if name != "kubelet_internal_checkpoint" and stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)

    def wait_registered(
        self, resource: str = "nvidia.com/gpu", count: int = 1, timeout: float = 15.0
    ) -> PluginEndpoint:
        deadline = time.monotonic() + timeout
        with self.registered:
            while sum(1 for r in self.registrations if r[0] == resource) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{resource} not registered {count} time(s); got {self.registrations}")
                self.registered.wait(left)
            return self.endpoints[resource]
