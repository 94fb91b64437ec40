"""Reading the node under settings.host_root, and small text helpers the checks share."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..config.settings import Settings


def host_path(settings: Settings, path: str) -> str:
    return os.path.join(settings.host_root, path.lstrip("/"))


def read_text(path: str) -> str | None:
    """The file's text, or None when it does not exist; other errors propagate to the guard."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def short_list(items: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
