"""The OS boundary: Mender's CLI, the bootloader environment, the running system.

Small classes with one job each, so tests put stand-ins on PATH (or swap the objects)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# mender-update's documented exit codes (standalone mode).
MENDER_NO_UPDATE_IN_PROGRESS = 2


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    output: str

    @property
    def last_line(self) -> str:
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def run_command(argv: Sequence[str], timeout_s: float | None = None) -> CommandResult:
    """Run a command, stdout and stderr together; a missing program is exit 127, like a shell."""
    try:
        completed = subprocess.run(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        return CommandResult(127, f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return CommandResult(124, f"{argv[0]}: no answer within {timeout_s:.0f}s")
    return CommandResult(completed.returncode, completed.stdout or "")


class Mender:
    """`mender-update` in standalone mode: install FILE|URL, commit, rollback."""

    def __init__(self, command: Sequence[str]) -> None:
        self.command = list(command)

    def install(self, source: str) -> CommandResult:
        # No timeout: streaming a GB rootfs onto an SD card takes as long as it takes; the
        # job's deadline bounds it, and a kill leaves the marker in 'installing'.
        return run_command([*self.command, "install", source])

    def commit(self) -> CommandResult:
        return run_command([*self.command, "commit"], timeout_s=300)

    def rollback(self) -> CommandResult:
        return run_command([*self.command, "rollback"], timeout_s=300)


class BootEnv:
    """Reads the bootloader environment with the tool Mender's integration installs:
    grub-mender-grubenv-print (GRUB, x86-64) or fw_printenv (U-Boot, Jetson Nano)."""

    def __init__(self, printer: Sequence[str] | None = None) -> None:
        self._printer = list(printer) if printer else None

    def printer(self) -> list[str]:
        if self._printer:
            return self._printer
        return ["grub-mender-grubenv-print"] if shutil.which("grub-mender-grubenv-print") else ["fw_printenv"]

    def get(self, key: str) -> str | None:
        result = run_command([*self.printer(), key], timeout_s=60)
        if result.returncode != 0:
            return None
        for line in result.output.splitlines():
            name, sep, value = line.strip().partition("=")
            if sep and name == key:
                return value
        return None

    def upgrade_pending(self) -> bool:
        """upgrade_available=1: an update is installed and not yet committed (or rolled back)."""
        value = self.get("upgrade_available")
        if value is None:
            raise SystemStateError(
                f"cannot read upgrade_available with {' '.join(self.printer())}: is this an A/B (Mender) image?"
            )
        return value.strip() == "1"


class SystemStateError(RuntimeError):
    """The node's update state cannot be read; nothing was changed."""


def missing_ab_updater(mender_command: Sequence[str], artifact_info: Path) -> str:
    """Why this image cannot take an A/B update ('' when it can): an image built without the
    A/B opt-in (an Orin image until its updater lands, a plain x86-64 wic image) has no
    mender-update and no /etc/mender/artifact_info."""
    missing = []
    if shutil.which(mender_command[0]) is None:
        missing.append(f"{mender_command[0]} is not installed")
    if not artifact_info.is_file():
        missing.append(f"{artifact_info} does not exist")
    if not missing:
        return ""
    return ("this image has no A/B updater (" + ", ".join(missing) + "): it cannot install OS updates or roll "
            "back; flash an A/B image once (docs/fleet.md, 'First flash with the A/B layout')")


class Host:
    """The running system: which image, which boot, reboot, time."""

    def __init__(self, artifact_info: Path, boot_id_file: Path, reboot_command: Sequence[str]) -> None:
        self.artifact_info = artifact_info
        self.boot_id_file = boot_id_file
        self.reboot_command = list(reboot_command)

    def booted_version(self) -> str:
        try:
            text = self.artifact_info.read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            raise SystemStateError(f"cannot read {self.artifact_info}: {error.strerror}") from None
        for line in text.splitlines():
            name, sep, value = line.strip().partition("=")
            if sep and name == "artifact_name" and value:
                return value.strip()
        raise SystemStateError(f"{self.artifact_info} has no artifact_name=... line")

    def boot_id(self) -> str:
        try:
            return self.boot_id_file.read_text().strip()
        except OSError as error:
            raise SystemStateError(f"cannot read {self.boot_id_file}: {error.strerror}") from None

    def reboot(self) -> CommandResult:
        return run_command(self.reboot_command, timeout_s=120)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()

    @staticmethod
    def boot_time() -> float:
        """Wall-clock time this boot started (btime in /proc/stat)."""
        try:
            for line in Path("/proc/stat").read_text().splitlines():
                if line.startswith("btime "):
                    return float(line.split()[1])
        except OSError:
            pass
        return time.time() - time.monotonic()
