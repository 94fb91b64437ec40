"""`./task flash --machine NAME`: which path writes which machine's image.

The Nano's tegraflash package (tools/flash/flash.py), the Orin's (tools/flash/orin.py), the Thor's
(tools/flash/thor.py: over USB only), and the x86-64 node's A/B disk image (.uefiimg), written
to the drive that goes into the PC with bmaptool, after the same disk checks and with the same
provisioning as an SD card. Each finds what `./task build --machine NAME [--role R]` made
(tools/image/build.py)."""

from __future__ import annotations

import os
import sys

from tools.flash import flash, orin, thor
from tools.image.build import MACHINES

# Machines whose image is a whole disk: meta-mender's A/B .uefiimg (never the plain .wic
# beside it, which has no second slot and so can take no update).
DISK_MACHINES = {"genericx86-64": "uefiimg"}
DISK_METHODS = ("full", "disk")  # accepted, though meaningless: the disk image is written as it is


def kind(machine: str) -> str | None:
    """'nano', 'orin', 'thor', 'disk', or None when ./task flash cannot write the machine's image."""
    yocto_machine = MACHINES[machine].yocto_machine
    if yocto_machine == flash.NANO.yocto_machine:
        return "nano"
    if orin.is_orin(yocto_machine):
        return "orin"
    if thor.is_thor(yocto_machine):
        return "thor"
    return "disk" if yocto_machine in DISK_MACHINES else None


def flashable_machines() -> list[str]:
    """The `--machine` names `./task flash` takes."""
    return [name for name in MACHINES if kind(name)]


def run_disk_flash(options: flash.FlashOptions, machine: str, euid: int | None = None,
                   interactive: bool | None = None) -> list[str]:
    """An x86-64 node: its A/B disk image (--sd-image, else the build's) to --device."""
    if options.method and options.method not in DISK_METHODS:
        raise flash.FlashUsageError(f"--machine {machine} writes one disk image: no --method {options.method!r} "
                                    "(leave --method out)")
    if not options.device:
        raise flash.FlashUsageError(
            f"--machine {machine} writes the node's disk image to a drive: give --device /dev/sdX (the drive that "
            "goes into the PC, in a USB adapter or a spare slot of this host)")
    if options.package is not None:
        raise flash.FlashUsageError(f"--package is a Jetson's tegraflash package; for {machine} give the disk image "
                                    "with --sd-image FILE, or leave it out to take the build's")
    token = flash.provisioning_token(options)
    suffix = DISK_MACHINES[MACHINES[machine].yocto_machine]
    image = options.sd_image or flash.find_built(machine, options, suffix, f"A/B disk image (.{suffix})",
                                                 "--sd-image FILE")
    return flash.write_image_file(options, image, os.geteuid() if euid is None else euid,
                                  sys.stdin.isatty() if interactive is None else interactive, token, what="drive")


def flash_machine(machine: str, options: flash.FlashOptions) -> list[str]:
    """`./task flash --machine NAME`. A dry run that went past a place where a real run stops
    raises DryRunStopped at the end (exit status 1), after showing everything."""
    if machine not in MACHINES or kind(machine) is None:
        why = " (a QEMU image boots in QEMU: ./task smoke-test)" if machine == "qemu" else ""
        raise flash.FlashUsageError(f"--machine {machine!r} cannot be flashed{why}; choose one of: "
                                    f"{', '.join(flashable_machines())}")
    path = kind(machine)
    if path == "orin":
        lines = orin.run_orin_flash(options, machine)
    elif path == "thor":
        lines = thor.run_thor_flash(options, machine)
    elif path == "disk":
        lines = run_disk_flash(options, machine)
    else:
        lines = flash.run_flash(options, machine=machine)
    if options.dry_run and options.stops:
        raise flash.DryRunStopped(lines, options.stops)
    return lines
