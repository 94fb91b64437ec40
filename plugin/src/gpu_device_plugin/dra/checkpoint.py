"""What the driver has prepared, kept on disk so prepare and unprepare are idempotent across its
restarts: the kubelet retries both until they succeed and calls them again after its own restart.

One JSON file, replaced atomically (temporary file, fsync, rename): a crash leaves the old one or
the new one. A file that cannot be read is set aside (`.corrupt`) and the driver starts empty: a
claim prepared again writes the same spec, and unprepare finds a claim's spec by its UID alone.
"""

import contextlib
import json
import logging
import os
from typing import Any

log = logging.getLogger(__name__)

FILE = "checkpoint.json"
VERSION = 1


class Checkpoint:
    def __init__(self, directory: str, driver: str, node: str) -> None:
        self.path = os.path.join(directory, FILE)
        self.driver = driver
        self.node = node
        self.claims: dict[str, dict[str, Any]] = {}

    def load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                document = json.load(f)
            if document.get("version") != VERSION or not isinstance(document.get("claims"), dict):
                raise ValueError(f"version {document.get('version')!r} or claims not understood")
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError) as exc:
            aside = self.path + ".corrupt"
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            log.error("checkpoint %s unreadable (%s): set aside as %s; starting with no prepared claims",
                      self.path, exc, aside)
            return
        self.claims = document["claims"]
        if document.get("driver") not in (None, self.driver) or document.get("node") not in (None, self.node):
            log.warning("checkpoint %s was written for driver %s on node %s; keeping its claims for unprepare",
                        self.path, document.get("driver"), document.get("node"))

    def save(self) -> None:
        """Raises OSError naming the file when it cannot be written (prepare then fails, and is retried)."""
        directory = os.path.dirname(self.path)
        data = json.dumps({"version": VERSION, "driver": self.driver, "node": self.node, "claims": self.claims},
                          indent=1, sort_keys=True).encode()
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(directory, mode=0o750, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise OSError(exc.errno, f"cannot write the checkpoint {self.path}: {exc.strerror}; check --state-dir "
                          "is writable by the driver") from exc
