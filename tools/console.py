"""Consistent, plain terminal output: what is happening, what went wrong, and a summary."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def _emit(prefix: str, message: str, stream=None) -> None:
    stream = stream or sys.stdout
    print(f"{prefix} {message}" if prefix else message, file=stream, flush=True)


def step(message: str) -> None:
    """A new phase of work starts."""
    _emit("==>", message)


def info(message: str) -> None:
    _emit("   ", message)


def warn(message: str) -> None:
    _emit("warning:", message)


def error(message: str) -> None:
    _emit("error:", message, sys.stderr)


def human_size(size_bytes: int) -> str:
    """1536 -> '1.5 KiB'; powers of 1024 because disks and images are sized that way."""
    size = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns sized to their widest cell."""
    widths = [len(h) for h in headers]
    for row in rows:
        for index, cell in enumerate(row):
            widths[index] = max(widths[index], len(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def summary(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    print(f"\n{title}\n{format_table(headers, rows)}", flush=True)
