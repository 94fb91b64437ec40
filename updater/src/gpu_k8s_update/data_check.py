"""What the layer's gpu-k8s-data-check did to the data partition, told in one short word and a
time for the node's `update.gpu-k8s.io/data` annotation (publish.py).

The check (meta-gpu-k8s/recipes-core/gpu-k8s-data) writes this boot's verdict as one JSON
object to /run/gpu-k8s/data-state.json: {"state", "device", "detail", "time"}, state one of
ok, repaired, recreated, unavailable. gpu-k8s-data then files each verdict that is not ok in
/data/gpu-k8s/data-events.log, one line per boot: {"boot_id", "check": <that object>}.

"Since the last update" is counted in lines of that log, not by clocks (the check runs before
the clock is set, and a board without a battery-backed clock starts in the past): the gate
records how many lines it held when it committed an update (the agent's events.log,
`gate-committed`, `data_events`). A data partition made again starts with an empty log and
no agent state at all, so its `recreated` line is always after the last update this /data
knows of."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

OK, REPAIRED, RECREATED, UNAVAILABLE = "ok", "repaired", "recreated", "unavailable"
UNKNOWN = "unknown"  # no verdict on record: an image without the check, or /run lost it
VERDICTS = (OK, REPAIRED, RECREATED, UNAVAILABLE)
# A /data that cannot be mounted now outranks a loss already behind it, which outranks a repair.
_SEVERITY = {OK: 0, REPAIRED: 1, RECREATED: 2, UNAVAILABLE: 3}
COMMIT_EVENT = "gate-committed"
COUNT_FIELD = "data_events"


@dataclass(frozen=True)
class DataReport:
    state: str  # one of VERDICTS, or UNKNOWN
    time: str = ""  # the check's own UTC time of that verdict
    detail: str = ""

    @property
    def annotation(self) -> str:
        """`ok`, `unknown`, or the verdict and when: `recreated 2026-11-29T12:00:00Z`."""
        return f"{self.state} {self.time}" if self.time and self.state not in (OK, UNKNOWN) else self.state


def _verdict(value: object) -> dict[str, Any] | None:
    if isinstance(value, dict) and value.get("state") in VERDICTS:
        return value
    return None


def read_boot_state(path: Path) -> dict[str, Any] | None:
    """This boot's verdict, or None when there is none (or it cannot be read)."""
    try:
        return _verdict(json.loads(path.read_text(encoding="utf-8", errors="replace")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("ignoring %s: %s", path, error)
        return None


def read_event_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    except OSError as error:
        log.warning("cannot read %s: %s", path, error.strerror)
        return []


def parse_events(lines: Sequence[str]) -> list[dict[str, Any]]:
    """The verdicts the log holds, in order; a line that is not one is skipped."""
    found = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        check = _verdict(entry.get("check")) if isinstance(entry, dict) else None
        if check is not None:
            found.append(check)
    return found


def lines_seen_at_last_commit(agent_events: Sequence[Mapping[str, Any]]) -> int:
    """How many lines the data-events log held when the gate last committed an update on this
    /data (0 when it never did: everything in the log is then news)."""
    seen = 0
    for event in agent_events:
        if not isinstance(event, Mapping) or event.get("event") != COMMIT_EVENT:
            continue
        if isinstance(event.get(COUNT_FIELD), int):
            seen = event[COUNT_FIELD]
    return seen


def summarize(boot_state: Mapping[str, Any] | None, event_lines: Sequence[str], seen: int) -> DataReport:
    """The most serious verdict since the last committed update: this boot's, and the log's
    lines after the `seen` first (all of them when the log is shorter: it was made again)."""
    since = list(event_lines[seen:]) if len(event_lines) >= seen else list(event_lines)
    verdicts = parse_events(since)
    if boot_state is not None and boot_state.get("state") != OK and dict(boot_state) not in verdicts:
        verdicts.append(dict(boot_state))  # gpu-k8s-data has not filed it yet, or could not (no /data)
    if not verdicts:
        return DataReport(OK) if boot_state is not None or event_lines else DataReport(UNKNOWN)
    worst = max(_SEVERITY[v["state"]] for v in verdicts)
    latest = [v for v in verdicts if _SEVERITY[v["state"]] == worst][-1]
    return DataReport(str(latest["state"]), str(latest.get("time", "")), str(latest.get("detail", "")))


def report(state_file: Path, events_file: Path, agent_events: Sequence[Mapping[str, Any]]) -> DataReport:
    return summarize(read_boot_state(state_file), read_event_lines(events_file),
                     lines_seen_at_last_commit(agent_events))
