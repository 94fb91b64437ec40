"""One pool per node: which ResourceSlices to create, update and delete so the API server holds what
discovery and health say now. Pure: the slices that exist and the devices we want in, a plan out.

The pool is named after the node and its generation goes up whenever its devices change, so the
scheduler never mixes an old slice with a new one (it reads only the highest generation of a pool).
A slice holds at most 64 devices (the API's limit once a device carries taints).

What the API server stores can differ from what we sent: fields behind a feature gate that is off
(device taints, allowMultipleAllocations) are dropped, a taint gains its timeAdded. So "nothing
changed" is judged against what the server answered to our last write of a slice (its echo), and
only when we know no echo (our first look after a start) against the devices themselves.
"""

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 64


class Existing(NamedTuple):
    """A ResourceSlice of ours as listed."""

    name: str
    resource_version: str
    pool: str
    generation: int
    slice_count: int
    devices: list[dict[str, Any]]


class Write(NamedTuple):
    name: str  # "" = create (generateName)
    resource_version: str
    index: int  # which chunk of the desired devices


class Plan(NamedTuple):
    generation: int
    chunks: list[list[dict[str, Any]]]
    writes: list[Write]
    deletes: list[str]

    @property
    def empty(self) -> bool:
        return not self.writes and not self.deletes


def existing(obj: Mapping[str, Any]) -> Existing:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    pool = spec.get("pool") or {}
    return Existing(str(meta.get("name", "")), str(meta.get("resourceVersion", "")), str(pool.get("name", "")),
                    int(pool.get("generation") or 0), int(pool.get("resourceSliceCount") or 0),
                    list(spec.get("devices") or []))


def chunks(devices: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    ordered = sorted(devices, key=lambda d: str(d["name"]))
    return [ordered[i:i + MAX_DEVICES_PER_SLICE] for i in range(0, len(ordered), MAX_DEVICES_PER_SLICE)]


def _by_name(devices: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(devices, key=lambda d: str(d.get("name")))


def plan(pool: str, found: Sequence[Existing], devices: Sequence[dict[str, Any]],
         echoes: Mapping[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]) -> Plan:
    """What to write so our slices hold `devices`. `echoes`: slice name -> (devices we last wrote there,
    devices the server answered with)."""
    ours = sorted((s for s in found if s.pool == pool), key=lambda s: s.name)
    stray = [s.name for s in found if s.pool != pool]  # another pool of ours on this node: a renamed node
    wanted = chunks(devices)
    top = max((s.generation for s in ours), default=0)
    if not wanted:
        return Plan(top, [], [], [s.name for s in ours] + stray)
    current = [s for s in ours if s.generation == top]

    def holds(slice_: Existing, chunk: list[dict[str, Any]]) -> bool:
        echo = echoes.get(slice_.name)
        if echo is not None and _by_name(echo[1]) == _by_name(slice_.devices):
            return _by_name(echo[0]) == _by_name(chunk)  # the server still has what it made of our last write
        return _by_name(slice_.devices) == _by_name(chunk)

    unchanged = (len(current) == len(wanted) == len(ours) and all(s.slice_count == len(wanted) for s in current)
                 and all(holds(s, chunk) for s, chunk in zip(current, wanted, strict=True)))
    if unchanged:
        return Plan(top, wanted, [], stray)
    writes = [Write(s.name, s.resource_version, i) for i, s in enumerate(ours[:len(wanted)])]
    writes += [Write("", "", i) for i in range(len(ours), len(wanted))]
    return Plan(top + 1, wanted, writes, [s.name for s in ours[len(wanted):]] + stray)


def slice_object(node: str, driver: str, plan_: Plan, write: Write, owner: Mapping[str, str] | None) -> dict[str, Any]:
    """The ResourceSlice a write sends: created under generateName, updated under its name and version."""
    meta: dict[str, Any] = {"name": write.name, "resourceVersion": write.resource_version} if write.name else {
        "generateName": f"{node}-{driver}-"}
    if owner:  # the Node owns its slices: they go when it is deleted
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": owner["name"], "uid": owner["uid"],
                                    "controller": True}]
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta,
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": plan_.generation, "resourceSliceCount": len(plan_.chunks)},
                     "devices": plan_.chunks[write.index]}}
