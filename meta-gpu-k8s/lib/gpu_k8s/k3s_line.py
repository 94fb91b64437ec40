"""Which k3s line a machine runs (pure: names and versions in, a verdict out).

GPU_K8S_K3S_LINE picks a line, e.g. "1.36"; recipes-containers/k3s/k3s-line-<line>.inc
holds the release the layer pins on it and the sha256 of its assets. The k3s recipes of
every line carried stay in the layer; each machine keeps the one on its line and skips the
others, so one setting moves a machine (e.g. the Nano held on the last line that still runs
on cgroup v1) without touching the rest. Kept free of bitbake so the tests can call it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

_LINE = re.compile(r"^\d+\.\d+$")
LINE_FILE = re.compile(r"^k3s-line-(\d+\.\d+)\.inc$")


def carried_lines(directories: Iterable[str | Path]) -> list[str]:
    """The lines with a hash set, from the k3s recipe directories of the layers in BBPATH."""
    found = set()
    for directory in directories:
        path = Path(directory)
        if path.is_dir():
            found.update(m.group(1) for m in (LINE_FILE.match(p.name) for p in path.iterdir()) if m)
    return sorted(found, key=lambda line: tuple(int(part) for part in line.split(".")))


def line_problem(line: str | None, pinned_version: str | None, carried: list[str]) -> str:
    """Why this machine's line cannot be built ('' when it can)."""
    line = (line or "").strip()
    if not _LINE.match(line):
        return f'GPU_K8S_K3S_LINE must be a k3s minor line like "1.36", got "{line}"'
    if not pinned_version:
        return (f'GPU_K8S_K3S_LINE is "{line}", but the layer carries no hash set for it '
                f"(recipes-containers/k3s/k3s-line-{line}.inc); lines carried: {', '.join(carried) or 'none'}")
    if not pinned_version.startswith(line + "."):
        return f"k3s-line-{line}.inc pins k3s {pinned_version}, which is not on the {line} line"
    return ""


def recipe_skip_reason(recipe_version: str, line: str, pinned_version: str) -> str:
    """A k3s recipe of another line is skipped on this machine ('' when it is the one)."""
    if recipe_version == pinned_version:
        return ""
    return (f"k3s {recipe_version} is not this machine's k3s: GPU_K8S_K3S_LINE is {line}, "
            f"which pins {pinned_version} (k3s-line-{line}.inc)")
