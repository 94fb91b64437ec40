"""Mender's stock rootfs-image update module with a bootloader environment: GRUB on x86-64
(grub-mender-grubenv), U-Boot on the Jetson Nano (fw_printenv). Install writes the passive
partition and sets mender_boot_part and upgrade_available=1; the bootloader tries the new slot
once (bootlimit=1) and switches back unless the update is committed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpu_k8s_update.ab.mender import MenderBackend
from gpu_k8s_update.model import BootState
from gpu_k8s_update.system import SystemStateError, run_command


def parse_env(output: str) -> dict[str, str]:
    """`name=value` lines, as fw_printenv and grub-mender-grubenv-print print them."""
    values = {}
    for line in output.splitlines():
        name, sep, value = line.strip().partition("=")
        if sep:
            values[name] = value
    return values


class BootEnvBackend(MenderBackend):
    printer: tuple[str, ...] = ()

    def __init__(self, mender_command: Sequence[str], image_info: Path) -> None:
        super().__init__(mender_command, image_info)
        self.tools = (self.printer[0],)

    def env(self, *keys: str) -> dict[str, str]:
        """The named variables; one the environment does not define is left out."""
        values: dict[str, str] = {}
        for key in keys:  # one call per name: the printers fail as a whole on an undefined one
            result = run_command([*self.printer, key], timeout_s=60)
            if result.returncode == 0:
                values.update(parse_env(result.output))
        return values

    def pending(self) -> BootState:
        value = self.env("upgrade_available").get("upgrade_available")
        if value is None:
            raise SystemStateError(
                f"cannot read upgrade_available with {' '.join(self.printer)}: is this an A/B (Mender) image?"
            )
        return BootState(pending=value.strip() == "1")

    def slots(self) -> dict[str, str]:
        env = self.env("mender_boot_part", "upgrade_available", "bootcount")
        return {"next_boot_part": env.get("mender_boot_part", "?"),
                "upgrade_available": env.get("upgrade_available", "?"), "bootcount": env.get("bootcount", "?")}


class MenderGrub(BootEnvBackend):
    """x86-64 (genericx86-64, qemux86-64): meta-mender's grub-mender-grubenv."""

    name = "mender-grub"
    printer = ("grub-mender-grubenv-print",)


class MenderUBoot(BootEnvBackend):
    """Jetson Nano (meta-mender-tegra, kirkstone): U-Boot's environment through libubootenv."""

    name = "mender-uboot"
    printer = ("fw_printenv",)
