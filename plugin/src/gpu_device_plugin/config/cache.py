"""A config file's parsed document, kept as JSON beside the exact text it was parsed from.

Importing PyYAML is about 15 ms of CPU, a sixth of the plugin's start (bench/kubelet_bench.py),
and the file seldom changes between starts: when its text is the text parsed last time, the
stored document is used and PyYAML is not imported at all. The store is systemd's
CacheDirectory ($CACHE_DIRECTORY, root's); without one (tests, `gpu-device-plugin check` from
a shell) nothing is stored. A store that cannot be read or written only means a normal parse.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

FILE_NAME = "config.json"


def cache_dir(environ: Mapping[str, str]) -> str:
    """systemd's CacheDirectory= for this unit ("" when not run by systemd with one)."""
    return environ.get("CACHE_DIRECTORY", "").split(":")[0]


def document(text: str, parse: Callable[[str], Any], directory: str = "", name: str = FILE_NAME,
             keep: Callable[[Any], bool] = lambda doc: True) -> Any:
    """`parse(text)`, or the document stored for exactly this text in `directory` under `name` (one
    file per kind of document: the config file, the DRA driver's kubeconfig). A document `keep`
    refuses (one holding secrets) is parsed every time, never stored."""
    path = os.path.join(directory, name) if directory else ""
    if path:
        stored = _read(path)
        if stored is not None and stored.get("text") == text and "document" in stored:
            return stored["document"]
    doc = parse(text)  # a syntax error raises here: nothing is stored for a bad file
    if path and keep(doc) and _survives_json(doc):
        _write(path, {"text": text, "document": doc})
    return doc


def _survives_json(doc: Any) -> bool:
    """Only a document JSON gives back unchanged is stored: YAML dates, binary, non-string keys
    or NaN are not, so such a file is parsed every time rather than read back different."""
    try:
        return json.loads(json.dumps(doc, allow_nan=False)) == doc
    except (TypeError, ValueError):
        return False


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return None
    return stored if isinstance(stored, dict) else None


def _write(path: str, stored: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(stored, f)
        os.replace(tmp, path)  # whole or not at all, even when two processes race
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
