"""Which containers hold which GPU, and how a GPU's values are attributed to them: pure, no I/O.

Two steps, each a plain function, so any source of "who holds what" can feed the second:

1. `holders_by_gpu` reads the kubelet's PodResources List (device-plugin devices: a whole GPU
   `<id>`, or a time-slicing replica `<id>::<n>` mapped to its physical GPU). A DRA driver's
   claims (PodResources' dynamic_resources) are another source of the same mapping:
   GPU ID -> [Holder], merged with `merge`.
2. `attribute(samples, holders)` decides the labels, with one rule that keeps every sum true:
   each GPU keeps exactly **one** series per field, carrying its whole value. It carries the
   holder's `pod`, `namespace` and `container` when exactly one container holds the GPU (a
   whole GPU, as dcgm-exporter labels it), and none when several share it (time-slicing).
   Per pod there is a separate share: each device ID a container holds (a whole GPU, or one
   replica) gets `1 / (device IDs of that GPU held)`, so one GPU's shares sum to 1. A value
   per pod is then `whole value x share`, and those add up to at most the whole, for every
   field.

dcgm-exporter differs on shared GPUs: without --kubernetes-virtual-gpus one container (the
last listed) labels the GPU's series; with it every container holding a replica gets a copy
of the whole value (sums over pods count the GPU once per container), except GPU_UTIL and
FB_USED, where it adds per-process figures. docs/telemetry.md says how to query each.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ..core.policy import REPLICA_SEPARATOR
from .collector import GpuSample


class Holder(NamedTuple):
    """A container holding a GPU, or one replica of it."""

    pod: str
    namespace: str
    container: str
    vgpu: str = ""  # the replica number when the GPU is time-sliced
    extra: tuple[tuple[str, str], ...] = ()  # labels another source adds (a DRA claim's name, ...)

    @property
    def container_key(self) -> tuple[str, str, str]:
        return self.namespace, self.pod, self.container

    def attributes(self, with_vgpu: bool = True) -> dict[str, str]:
        out = {"pod": self.pod, "namespace": self.namespace, "container": self.container, **dict(self.extra)}
        if self.vgpu and with_vgpu:
            out["vgpu"] = self.vgpu
        return out


class Share(NamedTuple):
    holder: Holder
    fraction: float  # of the GPU: the device IDs of it this holder has over all held; a GPU's sum to 1


class Attributed(NamedTuple):
    """One GPU's sample with what its series say about pods."""

    sample: GpuSample
    owner: Holder | None  # the one container holding the GPU, whose labels its series carry
    shares: tuple[Share, ...]


def physical_id(device_id: str) -> tuple[str, str]:
    """("GPU-x", "3") from "GPU-x::3"; ("GPU-x", "") for a whole GPU."""
    gpu, sep, replica = device_id.partition(REPLICA_SEPARATOR)
    return gpu, replica if sep else ""


def holders_by_gpu(pod_resources: Iterable[Any], resources: Collection[str],
                   gpu_ids: Collection[str]) -> dict[str, list[Holder]]:
    """GPU ID -> the containers holding it, in the kubelet's order, each once per device ID.

    `pod_resources` are PodResources messages (name, namespace, containers[].name,
    containers[].devices[].resource_name / device_ids); only devices of `resources` whose
    physical GPU is in `gpu_ids` count, so another plugin's devices never match ours.
    """
    out: dict[str, list[Holder]] = {}
    for pod in pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name not in resources:
                    continue
                for device_id in devices.device_ids:
                    gpu, replica = physical_id(device_id)
                    if gpu not in gpu_ids:
                        continue
                    holder = Holder(pod.name, pod.namespace, container.name, replica)
                    if holder not in out.setdefault(gpu, []):
                        out[gpu].append(holder)
    return out


def merge(*sources: Mapping[str, Sequence[Holder]]) -> dict[str, list[Holder]]:
    """One GPU -> holders mapping from several sources (device-plugin devices, DRA claims)."""
    out: dict[str, list[Holder]] = {}
    for source in sources:
        for gpu, holders in source.items():
            found = out.setdefault(gpu, [])
            found.extend(holder for holder in holders if holder not in found)
    return out


def attribute(samples: Sequence[GpuSample], holders: Mapping[str, Sequence[Holder]]) -> list[Attributed]:
    """Each GPU's sample with its owner (when one container holds it) and every holder's share."""
    out = []
    for sample in samples:
        held = list(holders.get(sample.labels.uuid, ()))
        containers = {holder.container_key for holder in held}
        owner = held[0]._replace(vgpu="") if len(containers) == 1 else None
        shares = tuple(Share(holder, 1 / len(held)) for holder in held)
        out.append(Attributed(sample, owner, shares))
    return out


def per_pod(attributed: Attributed, field: str) -> list[tuple[Holder, float]]:
    """The field's value split by share: what each holder is attributed of the GPU's whole."""
    whole = attributed.sample.values.get(field)
    if whole is None:
        return []
    return [(share.holder, whole * share.fraction) for share in attributed.shares]
