"""Just enough of the BitBake file syntax to read our own recipes in tests (no bitbake).

Reads `VAR[:override...] op "value"` assignments (with backslash continuations), `inherit`
and `require` lines, and the bodies of shell tasks. Values are returned unexpanded."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_ASSIGN = re.compile(
    r"^(?P<name>[A-Za-z0-9_\-${}/.:]+)(?P<flag>\[[^\]]+\])?\s*"
    r'(?P<op>\?\?=|\?=|:=|\+=|=\+|\.=|=\.|=)\s*"(?P<value>.*)"\s*$',
    re.S,
)
_TASK = re.compile(r"^(?P<name>[A-Za-z0-9_:${}\-]+)\s*\(\)\s*\{\s*$")


@dataclass
class Assignment:
    var: str  # base name, e.g. RDEPENDS
    overrides: tuple[str, ...]  # e.g. ("${PN}", "append", "tegra")
    op: str
    value: str
    flag: str | None = None

    def words(self) -> list[str]:
        return self.value.replace("\\\n", " ").split()


@dataclass
class BbFile:
    path: Path
    assignments: list[Assignment] = field(default_factory=list)
    inherits: list[str] = field(default_factory=list)
    requires: list[str] = field(default_factory=list)
    tasks: dict[str, str] = field(default_factory=dict)

    def values(self, var: str, *overrides: str) -> list[Assignment]:
        """Assignments to var whose override list is exactly `overrides`."""
        return [a for a in self.assignments if a.var == var and a.overrides == tuple(overrides)]

    def words(self, var: str, *overrides: str) -> list[str]:
        out: list[str] = []
        for a in self.values(var, *overrides):
            out.extend(a.words())
        return out

    def value(self, var: str, *overrides: str) -> str:
        found = self.values(var, *overrides)
        assert found, f"{self.path.name}: no assignment to {':'.join((var, *overrides))}"
        return found[-1].value


def _logical_lines(text: str) -> list[str]:
    lines, buf = [], ""
    for raw in text.splitlines():
        if buf:
            buf += "\n" + raw
        else:
            buf = raw
        if buf.rstrip().endswith("\\"):
            continue
        lines.append(buf)
        buf = ""
    if buf:
        lines.append(buf)
    return lines


def parse(path: Path) -> BbFile:
    bb = BbFile(path)
    lines = _logical_lines(path.read_text())
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        task = _TASK.match(line)
        if task or line.startswith("python "):
            name = task.group("name") if task else line.split()[1].rstrip("(){ ")
            body = []
            while i < len(lines) and lines[i].rstrip() != "}":
                body.append(lines[i])
                i += 1
            i += 1
            bb.tasks[name] = "\n".join(body)
            continue
        if line.startswith("inherit "):
            bb.inherits.extend(line.split()[1:])
            continue
        if line.startswith(("require ", "include ")):
            bb.requires.append(line.split()[1])
            continue
        m = _ASSIGN.match(line)
        if m:
            name, *ovr = m.group("name").split(":")
            bb.assignments.append(Assignment(name, tuple(ovr), m.group("op"), m.group("value"), m.group("flag")))
    return bb


def parse_with_requires(path: Path) -> BbFile:
    """The recipe plus the files it requires (relative to its directory), requires first."""
    own = parse(path)
    merged = BbFile(path)
    for req in own.requires:
        inc = parse_with_requires(path.parent / req)
        merged.assignments += inc.assignments
        merged.inherits += inc.inherits
        merged.tasks.update(inc.tasks)
    merged.assignments += own.assignments
    merged.inherits += own.inherits
    merged.tasks.update(own.tasks)
    merged.requires = own.requires
    return merged
