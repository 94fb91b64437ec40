"""Unit files read as systemd reads them, for ordering tests: a key given twice adds to the
list (After=a then After=b is both), an empty assignment empties it, drop-ins apply after the
unit in name order. Only what ordering and dependencies need; no specifiers, no templates."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

LIST_KEYS = {"After", "Before", "Requires", "Wants", "BindsTo", "Requisite", "PartOf", "Conflicts",
             "RequiresMountsFor", "WantedBy", "RequiredBy", "ExecStart", "ExecStartPre", "ExecStop",
             "EnvironmentFile", "Documentation"}


@dataclass
class Unit:
    name: str
    sections: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def apply(self, text: str) -> Unit:
        section = None
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = self.sections.setdefault(line[1:-1], {})
                continue
            assert section is not None, f"{self.name}: {line!r} before any [section]"
            key, _, value = line.partition("=")
            key, value = key.strip(), value.strip()
            if key in LIST_KEYS:
                values = section.setdefault(key, [])
                if not value:
                    values.clear()
                elif key.startswith("Exec"):
                    values.append(value)
                else:
                    values.extend(value.split())
            else:
                section[key] = [value]
        return self

    def get(self, section: str, key: str) -> list[str]:
        return list(self.sections.get(section, {}).get(key, []))

    def value(self, section: str, key: str) -> str | None:
        values = self.get(section, key)
        return values[-1] if values else None


def load(name: str, unit_text: str, dropins: Iterable[str] = ()) -> Unit:
    unit = Unit(name).apply(unit_text)
    for text in dropins:
        unit.apply(text)
    return unit


def load_files(path: Path, dropins: Iterable[Path] = ()) -> Unit:
    return load(path.name, path.read_text(), (p.read_text() for p in sorted(dropins, key=lambda p: p.name)))


def ordered_after(units: dict[str, Unit], later: str, earlier: str) -> bool:
    """Whether systemd starts `later` only once `earlier`'s job is done: an After= on one side
    or a Before= on the other (RequiresMountsFor= orders after the mount units too)."""
    after = set(units[later].get("Unit", "After")) if later in units else set()
    before = set(units[earlier].get("Unit", "Before")) if earlier in units else set()
    return earlier in after or later in before
