"""Which containers hold which GPU, from the kubelet's PodResources List: pure, no I/O.

dcgm-exporter's Kubernetes step: a GPU a container holds gets that container's `pod`,
`namespace` and `container` labels. A time-slicing replica (`<id>::<n>`) is mapped to its
physical GPU, and each container sharing the GPU gets a series of its own with `vgpu="<n>"`
(dcgm-exporter's behaviour with --kubernetes-virtual-gpus; without it, the last pod listed
would win and the others would not show). A GPU nobody holds keeps its plain series.
"""

from collections.abc import Collection, Iterable, Mapping
from typing import Any, NamedTuple

from ..core.policy import REPLICA_SEPARATOR


class Holder(NamedTuple):
    """A container holding a GPU (or one replica of it)."""

    pod: str
    namespace: str
    container: str
    vgpu: str = ""  # the replica number when the GPU is time-sliced

    def attributes(self) -> dict[str, str]:
        out = {"pod": self.pod, "namespace": self.namespace, "container": self.container}
        if self.vgpu:
            out["vgpu"] = self.vgpu
        return out


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


def describe(holders: Mapping[str, list[Holder]]) -> dict[str, list[str]]:
    """GPU ID -> ["namespace/pod (container)", ...] for people (the `metrics` command)."""
    return {gpu: [f"{h.namespace}/{h.pod} ({h.container}{', replica ' + h.vgpu if h.vgpu else ''})"
                  for h in found] for gpu, found in holders.items()}
