"""Decisions without I/O: what we advertise, what we prefer, what Allocate returns.

Every function here is a pure function of (GPUs, health, settings, request), so the
behaviour the kubelet sees is tested with plain values.
"""

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from ..cdi.names import TOOLKIT_KIND
from ..config.settings import DEFAULT_RESOURCE, FEATURE_VARIABLES, Settings
from ..model import HEALTHY, Gpu, Health

REPLICA_SEPARATOR = "::"
VOLUME_MOUNT_DIR = "/var/run/nvidia-container-devices"


class AllocationError(ValueError):
    """The kubelet asked for something we cannot give; the message names the IDs."""


class AdvertisedDevice(NamedTuple):
    """One entry of ListAndWatch: a whole GPU, or one time-slicing replica of it."""

    id: str
    gpu: Gpu
    replica: int | None = None


class ContainerAllocation:
    """One container's response, filled in by `allocate`."""

    __slots__ = ("envs", "mounts", "device_specs", "annotations", "cdi_devices")

    def __init__(self) -> None:
        self.envs: dict[str, str] = {}
        self.mounts: list[tuple[str, str, bool]] = []  # (container, host, read_only)
        self.device_specs: list[tuple[str, str, str]] = []  # (container, host, permissions)
        self.annotations: dict[str, str] = {}
        self.cdi_devices: list[str] = []


# ---------------------------------------------------------------- advertising


def resource_name(settings: Settings) -> str:
    ts = settings.time_slicing
    if ts.replicas > 1 and ts.rename_by_default:
        return f"{DEFAULT_RESOURCE}.shared"
    return DEFAULT_RESOURCE


def socket_name(resource: str) -> str:
    """nvidia.com/gpu -> nvidia-gpu.sock (the official plugin's naming, so tools find it)."""
    vendor, _, name = resource.partition("/")
    return f"{vendor.split('.')[0]}-{name}.sock"


def advertised_devices(gpus: Sequence[Gpu], settings: Settings) -> list[AdvertisedDevice]:
    """Whole GPUs, or `replicas` entries per GPU with IDs `<id>::<n>`. MIG GPUs are never handed out whole."""
    replicas = settings.time_slicing.replicas
    out: list[AdvertisedDevice] = []
    for gpu in sorted(gpus, key=lambda g: (g.index, g.id)):
        if gpu.mig_enabled:
            continue
        if replicas <= 1:
            out.append(AdvertisedDevice(gpu.id, gpu))
        else:
            out.extend(AdvertisedDevice(f"{gpu.id}{REPLICA_SEPARATOR}{n}", gpu, n) for n in range(replicas))
    return out


def device_states(
    devices: Sequence[AdvertisedDevice], health: Mapping[str, Health]
) -> list[tuple[str, bool, int | None]]:
    """(id, healthy, numa node) for ListAndWatch; every replica follows its physical GPU's health."""
    return [(d.id, health.get(d.gpu.id, HEALTHY).healthy, d.gpu.numa_node) for d in devices]


# ---------------------------------------------------------------- preferred allocation


def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    devices: Mapping[str, AdvertisedDevice],
    policy: str = "distributed",
) -> list[str]:
    """Choose `size` IDs from `available`, always including `must_include`.

    NUMA first: the rest of the request goes to the NUMA node(s) of `must_include` while they
    have room, then to the smallest node that holds all of what is left (a larger node stays
    whole for a larger request), and only when no node can, across nodes, largest first.
    Inside the nodes chosen:
    distributed: spread over physical GPUs (fewest picked in this request, then fewest in
    use), so a multi-replica request lands on distinct GPUs when it can.
    packed: fill the busiest GPU first, keeping whole GPUs free for later requests.
    Linear in the number of devices, so 8 GPUs x 256 replicas is answered in milliseconds.
    """
    chosen = [d for d in dict.fromkeys(must_include) if d in devices]
    if size <= len(chosen):
        return chosen  # must_include alone fills the request (the kubelet never asks for fewer)
    taken = set(chosen)
    candidates = [d for d in dict.fromkeys(available) if d in devices and d not in taken]
    if len(chosen) + len(candidates) <= size:
        return chosen + candidates  # no choice: every offered device is needed (one GPU, no sharing)
    available_set = set(available)
    # Replicas of a GPU that are advertised but not offered are in use by other containers.
    in_use = _count(d.gpu.id for i, d in devices.items() if i not in available_set)
    picked = _count(devices[i].gpu.id for i in chosen)
    home = {devices[i].gpu.numa_node for i in chosen}
    by_node: dict[int | None, list[str]] = {}
    for device_id in candidates:
        by_node.setdefault(devices[device_id].gpu.numa_node, []).append(device_id)
    for node_ids, count in numa_plan({n: len(ids) for n, ids in by_node.items()}, home, size - len(chosen)):
        group = [i for n in node_ids for i in by_node[n]]
        pick = _pick_packed if policy == "packed" else _pick_distributed
        chosen += pick(group, count, devices, picked, in_use)
    return chosen


def numa_plan(free: Mapping[int | None, int], home: Iterable[int | None],
              need: int) -> list[tuple[tuple[int | None, ...], int]]:
    """Which NUMA nodes give how many devices: [(nodes, count)], home nodes first.

    `free` is the number of offered devices per node (None: unknown node), `home` the nodes
    already holding part of the request.
    """
    if len(free) == 1:  # one node (or none known): the plan is that node, whatever is home
        node, offered = next(iter(free.items()))
        count = min(need, offered)
        return [((node,), count)] if count > 0 else []
    home_nodes = tuple(sorted((n for n in set(home) if n in free), key=_node_key))
    plan: list[tuple[tuple[int | None, ...], int]] = []
    home_free = sum(free[n] for n in home_nodes)
    if home_nodes:
        plan.append((home_nodes, min(need, home_free)))
        need -= min(need, home_free)
    rest = {n: c for n, c in free.items() if n not in home_nodes and c > 0}
    while need > 0 and rest:
        fitting = [n for n, c in rest.items() if c >= need]
        if fitting:  # best fit: the smallest node that holds it all
            node = min(fitting, key=lambda n: (rest[n], _node_key(n)))
        else:  # spans nodes anyway: the largest first keeps the span short
            node = min(rest, key=lambda n: (-rest[n], _node_key(n)))
        count = min(need, rest.pop(node))
        plan.append(((node,), count))
        need -= count
    return plan


def _count(gpu_ids: Iterable[str]) -> dict[str, int]:
    """Occurrences per GPU: a plain dict, as Counter costs several times more on the admission path."""
    counts: dict[str, int] = {}
    _add(counts, gpu_ids)
    return counts


def _node_key(node: int | None) -> tuple[bool, int]:
    return (node is None, node or 0)


def _by_gpu(group: Sequence[str], devices: Mapping[str, AdvertisedDevice]) -> dict[str, list[str]]:
    """Offered IDs per physical GPU, each GPU's replicas in order."""
    out: dict[str, list[str]] = {}
    for device_id in sorted(group, key=lambda i: devices[i].replica or 0):
        out.setdefault(devices[device_id].gpu.id, []).append(device_id)
    return out


def _pick_distributed(group: Sequence[str], count: int, devices: Mapping[str, AdvertisedDevice],
                      picked: dict[str, int], in_use: Mapping[str, int]) -> list[str]:
    """Round robin over GPUs: fewest picked in this request, then least in use, then index."""
    per_gpu = _by_gpu(group, devices)
    heap = [(picked.get(gid, 0), in_use.get(gid, 0) + picked.get(gid, 0), devices[ids[0]].gpu.index, gid)
            for gid, ids in per_gpu.items()]
    heapq.heapify(heap)
    out: list[str] = []
    next_replica = dict.fromkeys(per_gpu, 0)
    while len(out) < count and heap:
        n_picked, load, index, gid = heapq.heappop(heap)
        out.append(per_gpu[gid][next_replica[gid]])
        next_replica[gid] += 1
        if next_replica[gid] < len(per_gpu[gid]):
            heapq.heappush(heap, (n_picked + 1, load + 1, index, gid))
    _add(picked, (devices[i].gpu.id for i in out))
    return out


def _pick_packed(group: Sequence[str], count: int, devices: Mapping[str, AdvertisedDevice],
                 picked: dict[str, int], in_use: Mapping[str, int]) -> list[str]:
    """Drain the busiest GPU first (most in use or picked, then index)."""
    per_gpu = _by_gpu(group, devices)
    order = sorted(per_gpu, key=lambda gid: (-(in_use.get(gid, 0) + picked.get(gid, 0)),
                                             devices[per_gpu[gid][0]].gpu.index))
    out = [device_id for gid in order for device_id in per_gpu[gid]][:count]
    _add(picked, (devices[i].gpu.id for i in out))
    return out


def _add(counts: dict[str, int], gpu_ids: Iterable[str]) -> None:
    for gpu_id in gpu_ids:
        counts[gpu_id] = counts.get(gpu_id, 0) + 1


# ---------------------------------------------------------------- allocate


NAMED_IDS = 10  # the error travels in gRPC metadata (about 8 KiB at most): name a few, count the rest


def _named(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:NAMED_IDS])
    return shown if len(ids) <= NAMED_IDS else f"{shown} and {len(ids) - NAMED_IDS} more"


def validate_request(ids: Sequence[str], devices: Mapping[str, AdvertisedDevice], settings: Settings) -> None:
    if not ids:
        raise AllocationError("container request names no devices")
    unknown = [i for i in ids if i not in devices]
    if unknown:
        raise AllocationError(f"unknown device IDs: {_named(sorted(set(unknown)))}")
    if len(set(ids)) != len(ids):
        dupes = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise AllocationError(f"device IDs requested more than once: {_named(dupes)}")
    ts = settings.time_slicing
    if ts.replicas > 1 and ts.fail_requests_greater_than_one and len(ids) > 1:
        raise AllocationError(
            f"{len(ids)} shared GPUs requested but sharing.timeSlicing.failRequestsGreaterThanOne is set: "
            "request 1 (time-sliced replicas give no more GPU than one)"
        )


def _physical(ids: Iterable[str], devices: Mapping[str, AdvertisedDevice]) -> list[Gpu]:
    """Replica IDs back to distinct physical GPUs, in GPU index order."""
    gpus = {devices[i].gpu.id: devices[i].gpu for i in ids}
    return sorted(gpus.values(), key=lambda g: (g.index, g.id))


def runtime_id(gpu: Gpu, id_strategy: str) -> str:
    """The name the NVIDIA container runtime gets for a GPU.

    Tegra's runtime (CSV mode) has no UUIDs and injects the iGPU for any non-void value, so
    Tegra GPUs always go by index.
    """
    if id_strategy == "index" or gpu.backend == "tegra":
        return str(gpu.index)
    return gpu.id


def cdi_names(gpus: Sequence[Gpu], names: Sequence[str], settings: Settings,
              toolkit_name: Callable[[Gpu], str | None] | None) -> list[str] | None:
    """Qualified CDI names, or None when an NVML GPU has none (the container then falls back to envvar).

    NVML GPUs are named in the toolkit's spec only (ours would lack the driver libraries); a
    Jetson takes the toolkit's name where its spec covers it, else ours. `toolkit_name` says
    what the toolkit's spec on this host names a GPU (None: not covered); without it the
    toolkit's naming is assumed."""
    out = []
    for gpu, name in zip(gpus, names, strict=True):
        if gpu.backend not in ("nvml", "tegra"):
            out.append(f"{settings.cdi_kind}={name}")
            continue
        found = toolkit_name(gpu) if toolkit_name else (f"{TOOLKIT_KIND}={name}" if gpu.backend == "nvml" else None)
        if found is None and gpu.backend == "nvml":
            return None
        out.append(found or f"{settings.cdi_kind}={name}")
    return out


def feature_envs(settings: Settings) -> dict[str, str]:
    """NVIDIA_GDS, _MOFED, _GDRCOPY, _NVSWITCH as the settings say. "disabled" is said, not left out: the kubelet
    puts these after the image's environment, so an image's own "enabled" (which the toolkit honours for every
    GPU container, unprivileged included) no longer gives the container every such node of the host."""
    return {name: "enabled" if getattr(settings, attr) else "disabled" for attr, name in FEATURE_VARIABLES}


def allocate(ids: Sequence[str], devices: Mapping[str, AdvertisedDevice], settings: Settings,
             node_exists: Callable[[str], bool] = lambda node: True,
             toolkit_name: Callable[[Gpu], str | None] | None = None,
             fallback: tuple[str, str] = ("envvar", "")) -> ContainerAllocation:
    """The response for one container. Raises AllocationError for bad requests.

    `node_exists` says whether a host device node exists now: only those are passed, since a
    device the runtime cannot find fails the container. `toolkit_name`: see cdi_names.
    `fallback`: (strategy, why) for an NVML GPU the toolkit's spec does not name: the hand-over
    the nvidia runtime resolves without a spec under its configuration (toolkit_config), or
    ("", why none does), which refuses the allocation with that reason."""
    validate_request(ids, devices, settings)
    gpus = _physical(ids, devices)
    names = [runtime_id(g, settings.device_id_strategy) for g in gpus]
    strategies = settings.device_list_strategy
    result = ContainerAllocation()
    qualified = cdi_names(gpus, names, settings, toolkit_name) if any(s.startswith("cdi-") for s in strategies) else []
    if qualified is None:
        strategy, why = fallback
        if not strategy:
            # a container started without its GPU would look healthy and fail later: refuse at admission
            raise AllocationError(why or "a GPU is not in the NVIDIA Container Toolkit's CDI spec")
        strategies = tuple(dict.fromkeys([strategy, *(s for s in strategies if not s.startswith("cdi-"))]))
        qualified = []
    result.envs.update(feature_envs(settings))
    if "cdi-cri" in strategies:
        result.cdi_devices.extend(qualified)
    if "cdi-annotations" in strategies:
        # one key per container: a stable hash of its devices keeps keys unique and repeatable
        import hashlib  # here: loading OpenSSL costs start-up time and only this option needs it

        digest = hashlib.sha256(",".join(sorted(ids)).encode()).hexdigest()[:16]
        result.annotations[f"{settings.cdi_annotation_prefix}gpu-device-plugin_{digest}"] = ",".join(qualified)
    only_cdi = all(s.startswith("cdi-") for s in strategies)
    if only_cdi:
        return result
    if "envvar" in strategies:
        result.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(names)
    if "volume-mounts" in strategies:
        result.envs["NVIDIA_VISIBLE_DEVICES"] = VOLUME_MOUNT_DIR
        result.mounts.extend((f"{VOLUME_MOUNT_DIR}/{name}", "/dev/null", True) for name in names)
    if settings.pass_device_specs:
        nodes = dict.fromkeys(node for g in gpus for node in (*g.device_nodes, *g.optional_nodes))
        result.device_specs.extend((node, node, "rw") for node in nodes if node_exists(node))
    return result
