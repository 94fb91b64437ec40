"""The plugin's gRPC server with two toy methods, for the transport tests (test_h2_*.py):
Allocate answers with the IDs it was given; ListAndWatch sends `devices` entries whenever
`version` moves and records each watch it hands out (closed or not)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpu_device_plugin.api import wire
from gpu_device_plugin.api.grpc_server import CallContext, Method, Server
from gpu_device_plugin.api.limits import DEFAULT, Limits
from gpu_device_plugin.api.status import StatusCode
from h2_peer import ALLOCATE, LIST_AND_WATCH


class ToyWatch:
    def __init__(self, toy: Toy) -> None:
        self.toy = toy
        self.seen = -1
        self.polls = 0
        self.closed = threading.Event()

    def poll(self) -> tuple[list[Any], bool]:
        self.polls += 1
        if self.toy.done:
            return [], True
        version = self.toy.version
        if version == self.seen:
            return [], False
        self.seen = version
        return [self.toy.snapshot(version)], False

    def close(self) -> None:
        self.closed.set()


class Toy:
    def __init__(self, devices: int = 2) -> None:
        self.version = 0
        self.devices = devices
        self.done = False
        self.watches: list[ToyWatch] = []
        self.built = 0  # snapshots made: one per version, shared by every stream (as the servicer does)
        self._newest: tuple[int, Any] = (-1, None)

    def snapshot(self, version: int) -> Any:
        """`devices` entries; the first one's ID carries the version, so a reader can tell which."""
        if self._newest[0] != version:
            self.built += 1
            self._newest = (version, wire.ListAndWatchResponse(devices=[
                wire.Device(ID=f"v{version}-gpu-{i:05d}", health="Healthy") for i in range(self.devices)]))
        return self._newest[1]

    def allocate(self, request: Any, context: CallContext) -> Any:
        ids = [i for c in request.container_requests for i in c.devices_ids]
        if "bad" in ids:
            context.abort(StatusCode.INVALID_ARGUMENT, "unknown device bad")
        return wire.AllocateResponse(container_responses=[wire.ContainerAllocateResponse(envs={"IDS": ",".join(ids)})])

    def watch(self, request: Any, context: CallContext) -> ToyWatch:
        watch = ToyWatch(self)
        self.watches.append(watch)
        return watch

    @property
    def open_watches(self) -> int:
        return sum(not w.closed.is_set() for w in self.watches)


@contextmanager
def serving(socket_dir: str, toy: Toy | None = None, limits: Limits = DEFAULT) -> Iterator[tuple[Server, Toy, str]]:
    toy = toy or Toy()
    path = f"{socket_dir}/h2.sock"
    server = Server({ALLOCATE: Method(wire.AllocateRequest, toy.allocate, False),
                     LIST_AND_WATCH: Method(wire.Empty, toy.watch, True)}, limits=limits)
    server.bind(path)
    server.start()
    try:
        yield server, toy, path
    finally:
        server.stop()


def allocate_request(*ids: str) -> bytes:
    return wire.AllocateRequest(container_requests=[wire.ContainerAllocateRequest(devices_ids=list(ids))]) \
        .SerializeToString()


def decode_messages(data: bytes) -> list[Any]:
    """The ListAndWatch responses in a stream's DATA bytes."""
    out = []
    pos = 0
    while pos + 5 <= len(data):
        length = int.from_bytes(data[pos + 1:pos + 5], "big")
        out.append(wire.ListAndWatchResponse.FromString(data[pos + 5:pos + 5 + length]))
        pos += 5 + length
    return out
