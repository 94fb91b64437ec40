"""The DevicePlugin gRPC service: protobuf in, policy core, protobuf out. Nothing else."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from . import policy
from .api import pb
from .config import Settings
from .state import DeviceState

log = logging.getLogger(__name__)


class DevicePluginServicer:
    def __init__(self, state: DeviceState, settings: Callable[[], Settings],
                 on_allocate: Callable[[list[str]], None] | None = None) -> None:
        self._state = state
        self._settings = settings
        self._on_allocate = on_allocate or (lambda ids: None)
        self._stopped = threading.Event()
        self.streams = 0  # open ListAndWatch streams (for /healthz)
        self._streams_lock = threading.Lock()

    def stop(self) -> None:
        """End every open ListAndWatch stream (server shutdown or kubelet restart)."""
        self._stopped.set()
        self._state.wake()

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        context.add_callback(self._state.wake)  # RPC ended: wake our wait so the thread leaves
        with self._streams_lock:
            self.streams += 1
        try:
            seen = -1
            while True:
                token = self._state.wake_token()  # before the checks: a stop right after them still wakes us
                if self._stopped.is_set() or not context.is_active():
                    return
                version, states = self._state.snapshot()
                if version != seen:
                    seen = version
                    yield _list_response(states)
                    continue
                self._state.wait_for_change(seen, token)
        finally:
            with self._streams_lock:
                self.streams -= 1

    def GetPreferredAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        devices = self._state.by_id()
        policy_name = self._settings().allocation_policy
        response = pb.PreferredAllocationResponse()
        for creq in request.container_requests:
            chosen = policy.preferred_allocation(
                list(creq.available_deviceIDs), list(creq.must_include_deviceIDs),
                creq.allocation_size, devices, policy_name,
            )
            response.container_responses.add(deviceIDs=chosen)
        return response

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        devices = self._state.by_id()
        settings = self._settings()
        response = pb.AllocateResponse()
        try:
            allocations = [policy.allocate(list(c.devices_ids), devices, settings) for c in request.container_requests]
        except policy.AllocationError as exc:
            log.warning("allocation refused: %s", exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raises; this keeps type checkers honest
        for creq, alloc in zip(request.container_requests, allocations, strict=True):
            out = response.container_responses.add()
            out.envs.update(alloc.envs)
            out.annotations.update(alloc.annotations)
            for container_path, host_path, read_only in alloc.mounts:
                out.mounts.add(container_path=container_path, host_path=host_path, read_only=read_only)
            for container_path, host_path, permissions in alloc.device_specs:
                out.devices.add(container_path=container_path, host_path=host_path, permissions=permissions)
            for name in alloc.cdi_devices:
                out.cdi_devices.add(name=name)
            ids = list(creq.devices_ids)
            log.info("allocated %s -> %s", ",".join(ids), ", ".join(f"{k}={v}" for k, v in alloc.envs.items())
                     or ",".join(alloc.cdi_devices))
            self._on_allocate(ids)
        return response

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.PreStartContainerResponse()


def _list_response(states: list[tuple[str, bool, int | None]]) -> Any:
    response = pb.ListAndWatchResponse()
    for device_id, healthy, numa in states:
        device = response.devices.add(ID=device_id, health=pb.HEALTHY if healthy else pb.UNHEALTHY)
        if numa is not None and numa >= 0:
            device.topology.nodes.add(ID=numa)
    return response
