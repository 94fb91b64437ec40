"""What a configuration change may change while running. Pure: old and new settings in, a plan out."""

from collections.abc import Sequence
from typing import NamedTuple

from .loader import backend_conflict
from .settings import Settings

# Changing these needs a restart; a reload keeps the running values and says so.
RESTART_FIELDS = ("device_discovery_strategy", "simulated_gpus", "host_root", "kubelet_socket",
                  "simulated_health_dir", "metrics_address", "health_recovery_period", "allocation_api")


class ReloadPlan(NamedTuple):
    settings: Settings | None  # what to apply; None when there is nothing to do or it was rejected
    kept: tuple[str, ...] = ()  # restart-only fields whose running values stay
    rejection: str = ""  # why the change was refused (the last good settings stay)


def plan(old: Settings, new: Settings, backend: str | None) -> ReloadPlan:
    """`backend`: the discovery backend of the running GPUs (None on a GPU-less node)."""
    if new == old:
        return ReloadPlan(None)
    conflict = backend_conflict(new, backend) if backend else None
    if conflict:
        return ReloadPlan(None, rejection=conflict)
    kept = tuple(f for f in RESTART_FIELDS if getattr(new, f) != getattr(old, f))
    return ReloadPlan(keep_fields(new, old, kept), kept)


def keep_fields(new: Settings, old: Settings, names: Sequence[str]) -> Settings:
    return new._replace(**{n: getattr(old, n) for n in names})
