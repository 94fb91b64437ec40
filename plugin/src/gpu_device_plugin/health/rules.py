"""Pure health rules shared by the monitors: which Xids count, and when a GPU recovers.

No I/O here: the monitors feed plain values (an Xid, an observation, the time) and act on
the answers, so every rule is testable without NVML, a kernel log or a clock.
"""

import math
from collections.abc import Mapping
from typing import NamedTuple

# Xids that report an application's fault, not the GPU's: the official plugin's skip list.
# 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing
# (channel reset), 45 preemptive cleanup, 68 video processor exception, 109 context
# switch timeout.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"
_ALL_WORDS = ("all", "xids")


class XidPolicy(NamedTuple):
    """Which Xids mark a GPU Unhealthy, after the official plugin's environment variables.

    `disabled`: DP_DISABLE_HEALTHCHECKS was `all`/`xids`: nothing marks a GPU except Xids
    in `forced`. `forced_all`: DP_ENABLE_HEALTHCHECKS was `all`: every Xid counts.
    """

    disabled: bool = False
    ignored: frozenset[int] = APPLICATION_XIDS
    forced: frozenset[int] = frozenset()
    forced_all: bool = False
    warnings: tuple[str, ...] = ()  # for the caller to log once

    def is_critical(self, xid: int) -> bool:
        if self.forced_all or xid in self.forced:
            return True
        if self.disabled:
            return False
        return xid not in self.ignored

    @property
    def checks_enabled(self) -> bool:
        """False when health checking is off altogether (the monitor need not run)."""
        return not self.disabled or self.forced_all or bool(self.forced)

    @property
    def other_checks_enabled(self) -> bool:
        """Checks beyond Xids (ECC, device answering, device nodes): off with `all`/`xids`."""
        return not self.disabled


def _parse_xid_list(name: str, value: str) -> tuple[bool, set[int], list[str]]:
    """(all, xids, warnings) from a comma list such as "all", "48,79" or " 13 , 31 "."""
    every = False
    xids: set[int] = set()
    warnings: list[str] = []
    for token in value.split(","):
        token = token.strip().lower()
        if not token:
            continue
        if token in _ALL_WORDS:
            every = True
        elif token.isdigit():
            xids.add(int(token))
        else:
            warnings.append(f"{name}: {token!r} is not an Xid number, 'all' or 'xids'; ignored")
    return every, xids, warnings


def xid_policy_from_env(env: Mapping[str, str]) -> XidPolicy:
    """The official plugin's semantics for DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS.

    DP_DISABLE_HEALTHCHECKS: `all` or `xids` turns health checking off; otherwise a comma
    list of Xids ignored on top of the application-error list. DP_ENABLE_HEALTHCHECKS: Xids
    that always count, overriding both (`all` makes every Xid count).
    """
    disable_all, extra_ignored, warnings = _parse_xid_list(DISABLE_ENV, env.get(DISABLE_ENV, ""))
    enable_all, forced, enable_warnings = _parse_xid_list(ENABLE_ENV, env.get(ENABLE_ENV, ""))
    return XidPolicy(
        disabled=disable_all,
        ignored=APPLICATION_XIDS | frozenset(extra_ignored),
        forced=frozenset(forced),
        forced_all=enable_all,
        warnings=tuple(warnings + enable_warnings),
    )


class Observation(NamedTuple):
    """One look at a GPU: it answered normally (`ok`), or something was wrong (`reason`)."""

    ok: bool
    reason: str = ""


GOOD = Observation(True)


def bad(reason: str) -> Observation:
    return Observation(False, reason)


class HealthRecord(NamedTuple):
    """What a monitor remembers of one GPU between observations."""

    healthy: bool = True
    reason: str = ""  # why it is Unhealthy (the latest bad observation)
    last_bad: float = -math.inf  # clock time of the latest bad observation


def next_state(
    state: HealthRecord, observation: Observation, now: float, quiet_period_s: float
) -> HealthRecord:
    """Recovery rule: any bad observation marks Unhealthy and restarts the quiet period; a
    good observation makes an Unhealthy GPU Healthy once `quiet_period_s` has passed since
    the last bad one. A bad observation is always recorded, so a GPU that keeps failing
    never recovers.
    """
    if not observation.ok:
        return HealthRecord(healthy=False, reason=observation.reason, last_bad=now)
    if not state.healthy and now - state.last_bad >= quiet_period_s:
        return HealthRecord(healthy=True, reason="", last_bad=state.last_bad)
    return state
