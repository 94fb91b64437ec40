"""The driver's gRPC services, thin: protobuf to the preparer and the health state, and back.

Two sockets, as the kubelet expects of a DRA driver: the registration socket in the plugin watcher's
directory (pluginregistration v1: GetInfo names the DRA socket and the services on it), and the DRA
socket with the node service in both versions the kubelet may pick (v1 from 1.34, v1beta1 before)
and the health stream (dra-health v1alpha1, which the 1.36 kubelet watches with ResourceHealthStatus
on, its default).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..api import dra, wire
from ..api.grpc_server import CallContext, Method
from ..model import Health
from .prepare import ClaimRef, Preparer

log = logging.getLogger(__name__)

REGISTRATION = wire.message_classes(dra.REGISTRATION.messages)
V1 = wire.message_classes(dra.DRA_V1.messages)
V1BETA1 = wire.message_classes(dra.DRA_V1BETA1.messages)
HEALTH = wire.message_classes(dra.HEALTH.messages)
# The kubelet takes a device it has not heard of for this long as Unknown (its default: 30 s), so the
# stream repeats the snapshot every HEALTH_RESEND_S, well inside it, besides each change.
HEALTH_CHECK_TIMEOUT_S = 60
HEALTH_RESEND_S = 20.0


class Registration:
    """What the plugin watcher asks: who we are and where our DRA socket is; whether it took us."""

    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.last_error = ""

    def get_info(self, request: Any, context: CallContext) -> Any:
        return REGISTRATION["PluginInfo"](type=dra.DRA_PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint,
                                          supported_versions=[dra.V1_SERVICE, dra.V1BETA1_SERVICE])

    def notify(self, request: Any, context: CallContext) -> Any:
        if request.plugin_registered:
            if not self.registered.is_set():
                log.info("the kubelet registered DRA driver %s (%s)", self.driver, self.endpoint)
            self.last_error = ""
            self.registered.set()
        else:
            self.registered.clear()
            self.last_error = request.error
            log.error("the kubelet refused DRA driver %s: %s", self.driver, request.error or "no reason given")
        return REGISTRATION["RegistrationStatusResponse"]()

    def methods(self) -> dict[str, Method]:
        path = dra.REGISTRATION.method_path
        return {path("Registration", "GetInfo"): Method(REGISTRATION["InfoRequest"], self.get_info, False),
                path("Registration", "NotifyRegistrationStatus"): Method(REGISTRATION["RegistrationStatus"],
                                                                         self.notify, False)}


class DeviceHealth:
    """Each published device's health as the health stream tells it; a version wakes the streams."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._lock = threading.Lock()
        self._devices: dict[str, tuple[Health, int]] = {}  # device name -> (health, unix time of the last change)
        self.version = 0

    def set(self, devices: dict[str, Health]) -> bool:
        """The devices now; True when anything changed."""
        now = int(time.time())
        with self._lock:
            fresh = {name: (health, self._devices[name][1] if name in self._devices and
                            self._devices[name][0] == health else now) for name, health in devices.items()}
            if fresh == self._devices:
                return False
            self._devices = fresh
            self.version += 1
            return True

    def refresh(self) -> None:
        """Have every stream send the snapshot again (the kubelet's timeout on silence)."""
        with self._lock:
            self.version += 1

    def snapshot(self) -> tuple[int, list[Any]]:
        with self._lock:
            entries = [HEALTH["DeviceHealth"](
                device=HEALTH["DeviceIdentifier"](pool_name=self.pool, device_name=name),
                health=dra.HEALTHY if health.healthy else dra.UNHEALTHY, last_updated_time=since,
                health_check_timeout_seconds=HEALTH_CHECK_TIMEOUT_S, message=health.reason[:1024])
                for name, (health, since) in sorted(self._devices.items())]
            return self.version, entries


class HealthWatch:
    """One NodeWatchResources stream: a full snapshot whenever the health changed since the last one sent."""

    def __init__(self, health: DeviceHealth, stopping: Callable[[], bool]) -> None:
        self.health = health
        self.stopping = stopping
        self.sent = -1

    def poll(self) -> tuple[list[Any], bool]:
        if self.stopping():
            return [], True
        version, entries = self.health.snapshot()
        if version == self.sent:
            return [], False
        self.sent = version
        return [HEALTH["NodeWatchResourcesResponse"](devices=entries)], False

    def close(self) -> None:
        pass


class NodeService:
    """NodePrepareResources / NodeUnprepareResources in v1 and v1beta1, and the health stream."""

    def __init__(self, preparer: Preparer, health: DeviceHealth) -> None:
        self.preparer = preparer
        self.health = health
        self.stopping = False

    def _prepare(self, classes: dict[str, type], with_share: bool) -> Callable[[Any, CallContext], Any]:
        def handle(request: Any, context: CallContext) -> Any:
            refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
            response = classes["NodePrepareResourcesResponse"]()
            for uid, outcome in self.preparer.prepare(refs).items():
                devices = []
                for d in outcome.devices:
                    fields: dict[str, Any] = {"request_names": d.requests, "pool_name": d.pool,
                                              "device_name": d.device, "cdi_device_ids": d.cdi_ids}
                    if with_share and d.share_id:
                        fields["share_id"] = d.share_id
                    devices.append(classes["Device"](**fields))
                response.claims[uid] = classes["NodePrepareResourceResponse"](devices=devices, error=outcome.error)
            return response
        return handle

    def _unprepare(self, classes: dict[str, type]) -> Callable[[Any, CallContext], Any]:
        def handle(request: Any, context: CallContext) -> Any:
            refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
            response = classes["NodeUnprepareResourcesResponse"]()
            for uid, error in self.preparer.unprepare(refs).items():
                response.claims[uid] = classes["NodeUnprepareResourceResponse"](error=error)
            return response
        return handle

    def watch(self, request: Any, context: CallContext) -> HealthWatch:
        return HealthWatch(self.health, lambda: self.stopping)

    def methods(self) -> dict[str, Method]:
        out: dict[str, Method] = {}
        for api, classes, with_share in ((dra.DRA_V1, V1, True), (dra.DRA_V1BETA1, V1BETA1, False)):
            out[api.method_path("DRAPlugin", "NodePrepareResources")] = Method(
                classes["NodePrepareResourcesRequest"], self._prepare(classes, with_share), False)
            out[api.method_path("DRAPlugin", "NodeUnprepareResources")] = Method(
                classes["NodeUnprepareResourcesRequest"], self._unprepare(classes), False)
        out[dra.HEALTH.method_path("DRAResourceHealth", "NodeWatchResources")] = Method(
            HEALTH["NodeWatchResourcesRequest"], self.watch, True)
        return out
