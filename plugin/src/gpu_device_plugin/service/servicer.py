"""The DevicePlugin gRPC service: protobuf in, policy core, protobuf out. Nothing else."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..api import wire
from ..api.grpc_server import CallContext
from ..api.schema import HEALTHY, UNHEALTHY
from ..api.status import StatusCode
from ..cdi import toolkit_spec
from ..config.settings import Settings
from ..core import policy
from ..core.state import DeviceState
from ..host.paths import host_path_exists
from ..observability.logs import REQUESTS

log = logging.getLogger(__name__)
request_log = logging.getLogger(REQUESTS)  # one line each, rate-limited (logs.RequestNoise)

MAX_STREAMS = 2  # the kubelet's stream, and one more (a re-dial overlapping, or a debugging client)
# containers in one Allocate or GetPreferredAllocation: the kubelet asks for one per call; a request
# for more is refused before any answer is built (200,000 of them made a 14 MB answer and a 5 s stall)
MAX_CONTAINERS = 64


class StreamSlots:
    """Which ListAndWatch streams may be open: at most `limit` at once.

    A stream holds no thread (the server polls it), but each costs a poll per state change
    and a client may open them in a loop; the kubelet keeps one. The first stream after
    `expect_kubelet()` is the kubelet dialling back from Register: it is always admitted
    and ends every older stream, which belonged to an earlier registration or to another
    local client; any other stream beyond the cap is refused.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._open: dict[int, threading.Event] = {}  # stream number -> "end now" flag
        self._next = 0
        self._kubelet_expected = False

    def expect_kubelet(self) -> None:
        with self._lock:
            self._kubelet_expected = True

    def admit(self) -> tuple[int, threading.Event, bool, bool] | None:
        """A slot for a new stream (its number, its "end now" flag, whether it is the kubelet's, whether
        it ended older streams), or None when refused."""
        with self._lock:
            replaces_all = self._kubelet_expected
            if not replaces_all and len(self._open) >= self.limit:
                return None
            self._kubelet_expected = False
            if replaces_all:
                for end in self._open.values():
                    end.set()
            self._next += 1
            end = threading.Event()
            self._open[self._next] = end
            return self._next, end, replaces_all, replaces_all and len(self._open) > 1

    def release(self, number: int) -> None:
        with self._lock:
            self._open.pop(number, None)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._open)


class DevicePluginServicer:
    def __init__(self, state: DeviceState, settings: Callable[[], Settings],
                 on_allocate: Callable[[list[str]], None] | None = None, max_streams: int = MAX_STREAMS) -> None:
        self._state = state
        self._settings = settings
        self._on_allocate = on_allocate or (lambda ids: None)
        self._stopped = threading.Event()
        self._slots = StreamSlots(max_streams)
        self._lists = ListResponses(state)

    @property
    def streams(self) -> int:
        """Open ListAndWatch streams (for /healthz)."""
        return self._slots.count

    def expect_kubelet(self) -> None:
        """Called just before Register: the kubelet's stream that follows replaces older ones."""
        self._slots.expect_kubelet()

    def attach(self, waker: Callable[[], None]) -> None:
        """The serving server's wake(): called on every device or health change."""
        self._state.add_waker(waker)

    def detach(self, waker: Callable[[], None]) -> None:
        self._state.remove_waker(waker)

    def stop(self) -> None:
        """End every open ListAndWatch stream (server shutdown or kubelet restart)."""
        self._stopped.set()
        self._state.wake()

    def GetDevicePluginOptions(self, request: Any, context: CallContext) -> Any:
        return _OPTIONS

    def ListAndWatch(self, request: Any, context: CallContext) -> DeviceWatch:
        slot = self._slots.admit()
        if slot is None:
            request_log.warning("refused a ListAndWatch stream: %d are open already (the kubelet keeps one)",
                                self._slots.limit)
            context.abort(StatusCode.RESOURCE_EXHAUSTED,
                          f"{self._slots.limit} ListAndWatch streams are open already; close one first")
        assert slot is not None
        number, end, kubelet, replaced = slot
        if kubelet:
            context.serve_first()  # the kubelet's connection: the server reads it before any other
        if replaced:
            self._state.wake()  # the streams this one replaces see `end` at their next poll
        return DeviceWatch(self._lists, self._stopped, end, lambda: self._slots.release(number))

    def GetPreferredAllocation(self, request: Any, context: CallContext) -> Any:
        _check_containers(request, context)
        devices = self._state.by_id()
        policy_name = self._settings().allocation_policy
        return wire.PreferredAllocationResponse(container_responses=[
            wire.ContainerPreferredAllocationResponse(deviceIDs=policy.preferred_allocation(
                creq.available_deviceIDs, creq.must_include_deviceIDs, creq.allocation_size, devices, policy_name))
            for creq in request.container_requests])

    def Allocate(self, request: Any, context: CallContext) -> Any:
        _check_containers(request, context)
        try:
            response = self._allocate(request)
        except policy.AllocationError as exc:
            request_log.warning("allocation refused: %s", exc)
            context.abort(StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raises; this keeps type checkers honest
        for creq in request.container_requests:
            self._on_allocate(creq.devices_ids)
        return response

    def _allocate(self, request: Any) -> Any:
        """Allocate's answer, recording nothing (policy.AllocationError for a request it refuses)."""
        devices = self._state.by_id()
        settings = self._settings()
        root = settings.host_root

        def node_exists(node: str) -> bool:
            return host_path_exists(root, node)

        toolkit_name = toolkit_spec.namer(settings)  # None unless a cdi-* strategy is on
        allocations = [policy.allocate(c.devices_ids, devices, settings, node_exists, toolkit_name,
                                       toolkit_spec.fallback(settings, c.devices_ids) if toolkit_name
                                       else ("envvar", ""))
                       for c in request.container_requests]
        response = wire.AllocateResponse()
        for creq, alloc in zip(request.container_requests, allocations, strict=True):
            response.container_responses.append(wire.ContainerAllocateResponse(
                envs=alloc.envs, annotations=alloc.annotations,  # made for this answer: no copy
                mounts=[wire.Mount(container_path=c, host_path=h, read_only=r) for c, h, r in alloc.mounts],
                devices=[wire.DeviceSpec(container_path=c, host_path=h, permissions=p)
                         for c, h, p in alloc.device_specs],
                cdi_devices=[wire.CDIDevice(name=name) for name in alloc.cdi_devices]))
            # debug, not info: a line per admission was ~15 % of an Allocate round trip (more through
            # journald); /metrics counts allocations and the kubelet's checkpoint records them
            if log.isEnabledFor(logging.DEBUG):
                log.debug("allocated %s -> %s", ",".join(creq.devices_ids),
                          ", ".join(f"{k}={v}" for k, v in alloc.envs.items()) or ",".join(alloc.cdi_devices))
        return response

    def warm_up(self) -> None:
        """Run one admission's code once before the kubelet's first: both requests parsed, the
        preferred allocation and Allocate's answer made and written. The first admission after a
        start otherwise paid ~0.3 ms of CPU for code and data not yet in cache (bench/README.md).
        Nothing is recorded: no allocation is counted."""
        ids = [device.id for device in self._state.devices()[:2]]
        if not ids:
            return
        try:
            preferred = wire.PreferredAllocationRequest.FromString(wire.PreferredAllocationRequest(
                container_requests=[wire.ContainerPreferredAllocationRequest(
                    available_deviceIDs=ids, allocation_size=1)]).SerializeToString())
            self.GetPreferredAllocation(preferred, CallContext("warm-up")).SerializeToString()
            allocate = wire.AllocateRequest.FromString(wire.AllocateRequest(
                container_requests=[wire.ContainerAllocateRequest(devices_ids=ids[:1])]).SerializeToString())
            self._allocate(allocate).SerializeToString()
        except Exception as exc:  # never a reason not to serve: the kubelet's calls get the real error
            log.debug("warming the admission path failed: %s", exc)

    def PreStartContainer(self, request: Any, context: CallContext) -> Any:
        return wire.PreStartContainerResponse()


def _check_containers(request: Any, context: CallContext) -> None:
    count = len(request.container_requests)
    if count > MAX_CONTAINERS:
        request_log.warning("refused a request for %d containers (at most %d)", count, MAX_CONTAINERS)
        context.abort(StatusCode.RESOURCE_EXHAUSTED,
                      f"{count} containers in one request; at most {MAX_CONTAINERS} (the kubelet sends one)")


class ListResponses:
    """The ListAndWatch answer for the newest device-state version, made once and shared by every
    stream (the server then encodes it once too): a client opening and resetting streams in a loop
    costs a lookup each, not a list built and serialised each."""

    def __init__(self, state: DeviceState) -> None:
        self._state = state
        self._lock = threading.Lock()
        self._newest: tuple[int, Any] = (-1, None)

    def newest(self) -> tuple[int, Any]:
        version = self._state.version
        with self._lock:
            if self._newest[0] == version:
                return self._newest
        version, states = self._state.snapshot()
        response = _list_response(states)
        with self._lock:
            if version >= self._newest[0]:
                self._newest = (version, response)
            return self._newest


class DeviceWatch:
    """One ListAndWatch stream, polled by the server loop: the device list whenever it changed,
    until the plugin stops or a newer kubelet stream replaces this one."""

    def __init__(self, lists: ListResponses, stopped: threading.Event, end: threading.Event,
                 release: Callable[[], None]) -> None:
        self._lists = lists
        self._stopped = stopped
        self._end = end
        self._release = release
        self._seen = -1

    def poll(self) -> tuple[list[Any], bool]:
        if self._stopped.is_set() or self._end.is_set():
            return [], True
        version, response = self._lists.newest()
        if version == self._seen:
            return [], False
        self._seen = version
        return [response], False

    def close(self) -> None:
        self._release()


_OPTIONS = wire.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


def _list_response(states: list[tuple[str, bool, int | None]]) -> Any:
    return wire.ListAndWatchResponse(devices=[
        wire.Device(ID=device_id, health=HEALTHY if healthy else UNHEALTHY,
                    topology=wire.TopologyInfo(nodes=[wire.NUMANode(ID=numa)]) if numa is not None and numa >= 0
                    else None)
        for device_id, healthy, numa in states])
