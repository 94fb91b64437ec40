"""What the agent remembers on the data partition: the marker, the gate's last verdict and an
event log. Written atomically (temp file, fsync, rename) because a reboot can come at any time."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from gpu_k8s_update.model import Marker

log = logging.getLogger(__name__)


class StateStore:
    def __init__(self, marker_file: Path, gate_result_file: Path, events_file: Path) -> None:
        self.marker_file = marker_file
        self.gate_result_file = gate_result_file
        self.events_file = events_file

    def load_marker(self) -> Marker | None:
        data = _read_json(self.marker_file)
        if data is None:
            return None
        try:
            return Marker.from_json(data)
        except (KeyError, ValueError, TypeError):
            # A marker we cannot read must not block every future update; keep it for a person.
            broken = self.marker_file.with_suffix(".broken")
            log.warning("marker %s is unreadable; moved to %s and ignored", self.marker_file, broken)
            os.replace(self.marker_file, broken)
            return None

    def save_marker(self, marker: Marker) -> None:
        _write_json(self.marker_file, marker.to_json())

    def clear_marker(self) -> bool:
        try:
            self.marker_file.unlink()
        except FileNotFoundError:
            return False
        _fsync_dir(self.marker_file.parent)
        return True

    def load_gate_result(self) -> dict[str, Any] | None:
        return _read_json(self.gate_result_file)

    def save_gate_result(self, result: dict[str, Any]) -> None:
        _write_json(self.gate_result_file, {**result, "time": _now()})

    def record(self, event: str, **details: object) -> None:
        """Append one decision to the event log, for `gpu-k8s-update status` and post-mortems."""
        line = json.dumps({"time": _now(), "event": event, **details}, sort_keys=True)
        try:
            self.events_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.events_file, "a", encoding="utf-8") as stream:
                stream.write(line + "\n")
                stream.flush()
                os.fsync(stream.fileno())
        except OSError as error:
            log.warning("cannot append to %s: %s", self.events_file, error.strerror)

    def recent_events(self, count: int | None = 20) -> list[dict[str, Any]]:
        """The last `count` events (all of them for None)."""
        try:
            lines = self.events_file.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return []
        events = []
        for line in lines[-count:] if count else lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("ignoring %s: %s", path, error)
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as stream:
        json.dump(data, stream, indent=2, sort_keys=True)
        stream.write("\n")
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
