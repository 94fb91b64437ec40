"""One CDI spec per prepared claim: a device per GPU the claim was given, carrying exactly the edits
the spec that describes that GPU gives it (cdi/gpu_edits), and that spec's spec-wide edits.
Pure apart from `write` and `remove`.

The naming is the CDI library's for transient specs, as NVIDIA's DRA driver uses it: kind
`k8s.<driver>/claim`, file `k8s.<driver>-claim_<claim uid>.json`, device `<claim uid>-<device>`.
So each claim's devices are its own names, gone with its file when the claim is unprepared.
"""

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..cdi import spec as cdi_spec
from ..cdi.gpu_edits import GpuEdits

CDI_CLASS = "claim"
_LISTS = ("env", "deviceNodes", "mounts", "hooks")


def vendor(driver: str) -> str:
    return f"k8s.{driver}"


def kind(driver: str) -> str:
    return f"{vendor(driver)}/{CDI_CLASS}"


def path(cdi_dir: str, driver: str, uid: str) -> str:
    return os.path.join(cdi_dir, f"{vendor(driver)}-{CDI_CLASS}_{uid}.json")


def cdi_device_id(driver: str, uid: str, device: str) -> str:
    return f"{kind(driver)}={uid}-{device}"


def _merge(edits: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Spec-wide edits of several sources in one: list entries once each, in order; other keys first wins."""
    out: dict[str, Any] = {}
    seen: dict[str, set[str]] = {}
    for one in edits:
        for key, value in one.items():
            if key in _LISTS and isinstance(value, list):
                bucket = out.setdefault(key, [])
                keys = seen.setdefault(key, set())
                for item in value:
                    marker = json.dumps(item, sort_keys=True)
                    if marker not in keys:
                        keys.add(marker)
                        bucket.append(item)
            else:
                out.setdefault(key, value)
    return out


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")) if text in cdi_spec.KNOWN_VERSIONS else (0,)


def build(driver: str, uid: str, devices: Mapping[str, GpuEdits]) -> dict[str, Any]:
    """The spec for claim `uid` with `devices` (device name -> its GPU's edits)."""
    spec: dict[str, Any] = {"cdiVersion": "", "kind": kind(driver),
                            "devices": [{"name": f"{uid}-{name}", "containerEdits": dict(edits.device)}
                                        for name, edits in sorted(devices.items())]}
    common = _merge([edits.common for _, edits in sorted(devices.items())])
    if common:
        spec["containerEdits"] = common
    floor = max((e.cdi_version for e in devices.values()), key=_version, default="")
    wanted = cdi_spec.minimum_version(spec)
    spec["cdiVersion"] = floor if _version(floor) > _version(wanted) else wanted
    return spec


def write(spec: Mapping[str, Any], cdi_dir: str, driver: str, uid: str) -> str:
    """Atomically (temporary file, fsync, rename): a runtime never reads half a spec."""
    return cdi_spec.write_spec_file(spec, path(cdi_dir, driver, uid), clean_stale=False)


def remove(cdi_dir: str, driver: str, uid: str) -> bool:
    return cdi_spec.remove_spec_file(path(cdi_dir, driver, uid), clean_stale=False)


def remove_stale_temps(cdi_dir: str, driver: str) -> None:
    """Once at start: temporary files a killed driver left (not per write: a node may hold many claims)."""
    cdi_spec.remove_stale_temps(cdi_dir, f".{vendor(driver)}-{CDI_CLASS}_*")
