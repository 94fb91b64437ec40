"""What every backend shares: `mender-update` in standalone mode and the image's release name.
Mender 4 and later keep the installed artifact's name in their database on /data, written at
commit, so the running slot's release comes from the image itself (image-info)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from gpu_k8s_update.ab.interface import read_image_info
from gpu_k8s_update.system import CommandResult, run_command

# mender-update's exit codes (standalone mode).
MENDER_NO_UPDATE_IN_PROGRESS = 2
MENDER_REBOOT_REQUIRED = 4  # installed, reboot required (with --reboot-exit-code)

FIRST_FLASH_HINT = "flash an A/B image once (docs/fleet.md, 'First flash with the A/B layout')"


class MenderUpdate:
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


class MenderBackend:
    """Base of the Mender backends: the programs the image must carry, install/commit/rollback
    through mender-update (its update module does the slot work), the release from image-info."""

    name = "mender"
    # Programs on PATH this integration needs besides mender-update.
    tools: tuple[str, ...] = ()

    def __init__(self, mender_command: Sequence[str], image_info: Path) -> None:
        self.mender = MenderUpdate(mender_command)
        self.image_info = image_info

    def missing(self) -> list[str]:
        """What this image lacks for the backend, one phrase each."""
        missing = [f"{tool} is not installed" for tool in (self.mender.command[0], *self.tools)
                   if shutil.which(tool) is None]
        if not self.image_info.is_file():
            missing.append(f"{self.image_info} does not exist")
        return missing

    def check(self) -> str:
        missing = self.missing()
        if not missing:
            return ""
        return (f"this image has no working A/B updater ({self.name}: " + ", ".join(missing) + "): it cannot "
                f"install OS updates or roll back; {FIRST_FLASH_HINT}")

    def booted_version(self) -> str:
        return read_image_info(self.image_info).artifact_name

    def install(self, source: str) -> CommandResult:
        return self.mender.install(source)

    def commit(self) -> CommandResult:
        return self.mender.commit()

    def rollback(self) -> CommandResult:
        return self.mender.rollback()
