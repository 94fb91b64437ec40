"""One check's answer, and the report a person reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
STATUSES = (PASS, WARN, FAIL, SKIP)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | warn | fail | skip
    detail: str  # what was found
    fix: str = ""  # one line: what the person should do (empty on pass)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Check status must be one of {', '.join(STATUSES)}, got {self.status!r}")


def format_report(checks: Sequence[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"{check.status.upper():<4}  {check.name}: {check.detail}")
        if check.status in (WARN, FAIL) and check.fix:
            lines.append(f"      fix: {check.fix}")
    counts: Mapping[str, int] = {s: sum(c.status == s for c in checks) for s in STATUSES}
    summary = ", ".join(f"{counts[s]} {s}" for s in STATUSES)
    if counts[FAIL]:
        verdict = "GPU pods will not work until the FAIL lines are fixed (top to bottom)"
    elif counts[WARN]:
        verdict = "no failures; read the WARN lines if GPU pods still stay Pending"
    else:
        verdict = "this node is set up for GPU pods"
    lines.append(f"{len(checks)} checks: {summary}; {verdict}")
    return "\n".join(lines)


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0
