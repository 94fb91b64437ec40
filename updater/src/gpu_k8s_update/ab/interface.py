"""The interface every A/B backend implements, and the image-info file that names the backend
and the release an image carries."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpu_k8s_update.model import BootState
from gpu_k8s_update.system import CommandResult, SystemStateError


class ABBackend(Protocol):
    """What the gate and the upgrade command need from an A/B update mechanism. Every method
    but check() may raise SystemStateError when the node's state cannot be read."""

    name: str

    def check(self) -> str:
        """'' when this image can take A/B updates through this backend, else why not (one line)."""

    def booted_version(self) -> str:
        """The release (artifact name) of the root filesystem running now."""

    def pending(self) -> BootState:
        """Whether an update is installed and not yet committed or rolled back, and what else
        the backend sees of it (a staged switch, an early commit, a split boot chain)."""

    def install(self, source: str) -> CommandResult:
        """Write the artifact at `source` (URL or file) into the other slot; the next boot tries it."""

    def commit(self) -> CommandResult:
        """Make the running new slot permanent."""

    def rollback(self) -> CommandResult:
        """Point the boot back at the old slot (the caller reboots), or drop a half-done install."""

    def slots(self) -> dict[str, str]:
        """Which slot runs and which boots next, with the backend's own details, for people."""


@dataclass(frozen=True)
class ImageInfo:
    """/usr/share/gpu-k8s-update/image-info: written into each root filesystem at build time."""

    artifact_name: str  # the release version (MENDER_ARTIFACT_NAME)
    ab_backend: str  # mender-grub | mender-uboot | mender-tegra


def parse_image_info(text: str, source: str) -> ImageInfo:
    values = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and not name.startswith("#"):
            values[name.strip()] = value.strip()
    if not values.get("artifact_name"):
        raise SystemStateError(f"{source} has no artifact_name=... line")
    return ImageInfo(values["artifact_name"], values.get("ab_backend", ""))


def read_image_info(path: Path) -> ImageInfo:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise SystemStateError(f"cannot read {path}: {error.strerror}") from None
    return parse_image_info(text, str(path))
