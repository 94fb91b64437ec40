"""A skipped test as the `test` summary lists it, whichever runner (pytest, go test) skipped it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Skip:
    """Tests skipped for one reason in one file (a whole module when skipped at collection)."""

    where: str  # the test file, relative to the repository
    reason: str
    count: int = 1
    module: bool = False


def counted(skips: Iterable[tuple[str, str, bool]]) -> list[Skip]:
    """(where, reason, module) per skipped test -> one Skip per file and reason, sorted."""
    tally = Counter(skips)
    return [Skip(where, reason, count, module) for (where, reason, module), count in sorted(tally.items())]
