"""Keeps this node's ResourceSlices equal to what the driver offers, whatever happens to them.

A thread reconciles whenever asked (start, a GPU's health changed, the devices changed) and whenever
our slices change under us: a second thread watches them, so a slice someone deleted (the kubelet
wipes a driver's slices when it cannot reach the driver, and all of a node's at its own start) or
edited comes back at once. A failed call is retried with back-off, never raised.

Device taints are served by resource.k8s.io/v1 behind DRADeviceTaints (beta, on by default at
1.36); an API server with the gate off drops them silently. If the answer to a write lacks the taints
we sent, unhealthy GPUs are withdrawn from the slice instead, and come back when they recover.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from . import slices
from .cluster import Cluster
from .kube import ApiError

log = logging.getLogger(__name__)

RESYNC_S = 600.0  # a full re-check now and then, in case a watch missed something
RETRY_FIRST_S, RETRY_MAX_S = 0.2, 30.0

# devices(taints_served) -> the ResourceSlice devices to publish now
DeviceSource = Callable[[bool], list[dict[str, Any]]]


class Publisher:
    def __init__(self, cluster: Cluster, devices: DeviceSource) -> None:
        self.cluster = cluster
        self.devices = devices
        self.taints_served = True
        self.published = threading.Event()  # set after each reconcile that left the API server right
        self.first_published_at: float | None = None
        self.last_error = ""
        self.writes = 0
        self._echoes: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        self._deleted: set[str] = set()  # slices we deleted ourselves: their DELETED events are no news
        self._written_versions: dict[str, None] = {}  # ordered: the oldest go first
        self._owner: dict[str, str] | None = None
        self._owner_known = False
        self._resource_version = ""
        self._cond = threading.Condition()
        self._dirty = True
        self._stopping = False
        self._watch: Any = None
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ control

    def start(self) -> None:
        for target, name in ((self._run, "dra-publisher"), (self._watch_loop, "dra-slice-watch")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def request(self) -> None:
        """From any thread: reconcile soon (the devices or their health changed)."""
        with self._cond:
            self._dirty = True
            self.published.clear()
            self._cond.notify_all()

    def stop(self, withdraw: bool = False) -> None:
        """Stop both threads; with `withdraw`, delete our slices first (the node no longer offers GPUs)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        watch = self._watch
        if watch is not None:
            watch.close()
        for thread in self._threads:
            thread.join(timeout=5)
        if withdraw:
            try:
                found, _ = self.cluster.list_slices()
                for obj in found:
                    self.cluster.delete_slice(obj["metadata"]["name"])
            except ApiError as exc:
                log.warning("could not withdraw our ResourceSlices: %s", exc)

    # ------------------------------------------------------------ reconcile

    def reconcile(self) -> bool:
        """One pass; True when the API server holds what we offer."""
        if not self._owner_known:
            self._owner, self._owner_known = self.cluster.node_owner(), True
        objects, self._resource_version = self.cluster.list_slices()
        found = [slices.existing(obj) for obj in objects]
        wanted = self.devices(self.taints_served)
        plan = slices.plan(self.cluster.node, found, wanted, self._echoes)
        for write in plan.writes:
            obj = slices.slice_object(self.cluster.node, self.cluster.driver, plan, write, self._owner)
            answer = self.cluster.update_slice(obj) if write.name else self.cluster.create_slice(obj)
            self.writes += 1
            meta = answer.get("metadata") or {}
            sent = plan.chunks[write.index]
            echoed = list((answer.get("spec") or {}).get("devices") or [])
            self._echoes[str(meta.get("name"))] = (sent, echoed)
            self._remember_written(str(meta.get("resourceVersion", "")))
            if self.taints_served and _taints_dropped(sent, echoed):
                log.warning("the API server dropped the device taints we sent (DRADeviceTaints is off there): "
                            "unhealthy GPUs are withdrawn from the ResourceSlice instead of tainted")
                self.taints_served = False
                self._dirty = True
        for name in plan.deletes:
            self._deleted.add(name)
            self.cluster.delete_slice(name)
            self._echoes.pop(name, None)
        if plan.writes or plan.deletes:
            log.info("ResourceSlices of %s: pool %s generation %d, %d device(s) in %d slice(s)%s",
                     self.cluster.node, self.cluster.node, plan.generation, len(wanted), len(plan.chunks),
                     f", {len(plan.deletes)} removed" if plan.deletes else "")
        return not self._dirty

    def _remember_written(self, version: str) -> None:
        """The versions our own writes made: their watch events are no news (the newest 256 are enough)."""
        self._written_versions[version] = None
        while len(self._written_versions) > 256:
            del self._written_versions[next(iter(self._written_versions))]

    def _run(self) -> None:
        delay = RETRY_FIRST_S
        next_resync = time.monotonic() + RESYNC_S
        while True:
            with self._cond:
                while not self._stopping and not self._dirty and time.monotonic() < next_resync:
                    self._cond.wait(max(0.0, next_resync - time.monotonic()))
                if self._stopping:
                    return
                self._dirty = False
            try:
                done = self.reconcile()
            except ApiError as exc:
                self._failed(str(exc), delay)
                with self._cond:
                    self._dirty = True
                    self._cond.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_FIRST_S
            next_resync = time.monotonic() + RESYNC_S
            if done:
                self.last_error = ""
                if self.first_published_at is None:
                    self.first_published_at = time.monotonic()
                self.published.set()

    def _failed(self, why: str, delay: float) -> None:
        if why != self.last_error:
            log.warning("publishing ResourceSlices failed: %s; retrying in %.1fs", why, delay)
        self.last_error = why

    # ------------------------------------------------------------ watch

    def _watch_loop(self) -> None:
        delay = RETRY_FIRST_S
        while not self._stopping:
            version = self._resource_version
            try:
                if not version:
                    # a list of our own: whatever happened before it (a slice deleted) no watch event will
                    # tell, so a reconcile compares it with what we offer
                    _, version = self.cluster.list_slices()
                    self.request()
                self._watch = self.cluster.watch_slices(version)
                log.debug("watching our ResourceSlices from version %s", version)
                if self._stopping:
                    self._watch.close()
                    return
                for kind, obj in self._watch:
                    delay = RETRY_FIRST_S
                    meta = obj.get("metadata") or {}
                    if kind == "BOOKMARK":
                        self._resource_version = str(meta.get("resourceVersion", version))
                        continue
                    if kind == "ERROR":  # e.g. 410 Gone: the version is too old; list again
                        self._resource_version = ""
                        break
                    self._resource_version = str(meta.get("resourceVersion", version))
                    if kind == "DELETED" and meta.get("name") not in self._deleted:
                        log.info("our ResourceSlice %s was deleted by someone else: publishing again", meta.get("name"))
                        self.request()
                    elif kind in ("ADDED", "MODIFIED") and \
                            str(meta.get("resourceVersion")) not in self._written_versions:
                        # someone else's write, or our own whose answer has not arrived yet: a reconcile tells
                        log.debug("our ResourceSlice %s was %s: checking it", meta.get("name"), kind.lower())
                        self.request()
            except (ApiError, OSError, ValueError) as exc:
                if self._stopping:
                    return
                log.debug("watching our ResourceSlices failed (%s); again in %.1fs", exc, delay)
                self._resource_version = ""
                with self._cond:
                    self._cond.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)


def _taints_dropped(sent: list[dict[str, Any]], echoed: list[dict[str, Any]]) -> bool:
    tainted = {d["name"] for d in sent if d.get("taints")}
    return bool(tainted) and not any(d.get("taints") for d in echoed if d.get("name") in tainted)
