"""The OS boundary shared by every part: running a program, the running system (boot id,
reboot, time). The A/B mechanisms live in ab/.

Small classes with one job each, so tests put stand-ins on PATH (or swap the objects)."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


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


class SystemStateError(RuntimeError):
    """The node's update state cannot be read; nothing was changed."""


class Host:
    """The running system: which boot, reboot, time."""

    def __init__(self, boot_id_file: Path, reboot_command: Sequence[str]) -> None:
        self.boot_id_file = boot_id_file
        self.reboot_command = list(reboot_command)

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
