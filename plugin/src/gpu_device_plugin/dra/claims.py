"""A ResourceClaim (resource.k8s.io/v1 JSON) as a prepare plan: which of this node's GPUs it was given,
for which requests, as which share, with which configuration. Pure: a claim and our devices in,
a ClaimPlan or a PrepareRefused naming the reason out.

What the kubelet checks too is checked here, since a driver must not prepare the wrong thing: the
claim's UID is the one the kubelet asked for (a claim deleted and re-created under the same name
is another claim), it is allocated, and every result of our driver names our pool and a GPU we
have. Results of other drivers are theirs to prepare. Configuration comes from the class first and
the claim second, a later entry for the same request replacing an earlier one (the API's order).
"""

from collections.abc import Mapping
from typing import Any, NamedTuple

from .sharing import ConfigRefused, GpuConfig, parse


class PrepareRefused(ValueError):
    """This claim cannot be prepared here; the message says why (the kubelet shows it on the pod)."""


class PlannedDevice(NamedTuple):
    request: str  # the result's request, "<request>" or "<request>/<subrequest>"
    pool: str
    device: str
    share_id: str  # "" unless the device was allocated as one of several shares
    config: GpuConfig

    @property
    def base_request(self) -> str:
        """What the kubelet matches a container's claim request against (subrequest stripped)."""
        return self.request.split("/", 1)[0]


class ClaimPlan(NamedTuple):
    uid: str
    namespace: str
    name: str
    devices: list[PlannedDevice]


def _configs(allocation: Mapping[str, Any], driver: str) -> list[tuple[tuple[str, ...], GpuConfig]]:
    """(requests it applies to, config) for each opaque entry of ours, class entries before claim entries."""
    entries = list(((allocation.get("devices") or {}).get("config")) or [])
    ordered = sorted(enumerate(entries), key=lambda e: (0 if e[1].get("source") == "FromClass" else 1, e[0]))
    out = []
    for index, entry in ordered:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        where = f"{'class' if entry.get('source') == 'FromClass' else 'claim'} config[{index}]"
        out.append((tuple(entry.get("requests") or ()), parse(opaque.get("parameters"), driver, where)))
    return out


def _applies(requests: tuple[str, ...], request: str) -> bool:
    return not requests or request in requests or request.split("/", 1)[0] in requests


def plan(claim: Mapping[str, Any], uid: str, driver: str, pool: str, devices: set[str]) -> ClaimPlan:
    meta = claim.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    who = f"ResourceClaim {namespace}/{name}"
    if str(meta.get("uid", "")) != uid:
        raise PrepareRefused(f"{who} has UID {meta.get('uid')}, not {uid}: it was deleted and made again; "
                             "the pod must be recreated to use the new one")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareRefused(f"{who} is not allocated yet")
    try:
        configs = _configs(allocation, driver)
    except ConfigRefused as exc:
        raise PrepareRefused(f"{who}: {exc}") from None
    planned = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("driver") != driver:
            continue
        request, device = str(result.get("request", "")), str(result.get("device", ""))
        if result.get("pool") != pool:
            raise PrepareRefused(f"{who}: request {request} was given {result.get('pool')}/{device}, but this "
                                 f"node's pool is {pool}")
        if device not in devices:
            raise PrepareRefused(f"{who}: request {request} was given {device}, which this node does not offer "
                                 f"(it has {', '.join(sorted(devices)) or 'no GPU'})")
        config = GpuConfig()
        for requests, candidate in configs:
            if _applies(requests, request):
                config = candidate
        planned.append(PlannedDevice(request, pool, device, str(result.get("shareID") or ""), config))
    return ClaimPlan(uid, namespace, name, planned)
