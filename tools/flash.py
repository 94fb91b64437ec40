"""`flash`: put a built image on a Jetson Nano (USB recovery flash) or on an SD card."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import blockdev, console, process, provision, usb
from tools.build import MACHINES
from tools.paths import BUILD_ROOT

NANO = MACHINES["jetson-nano"]

METHODS = {
    "full": "flash everything over USB in recovery mode (doflash.sh): eMMC modules and first boot",
    "spi-only": "flash only the QSPI boot firmware over USB (doflash.sh --spi-only): SD-card devkits",
    "sdcard": "make an SD card image with dosdcard.sh; written to --device when given",
}


class FlashError(Exception):
    """Flashing cannot go ahead or failed; the message names the problem and the fix."""


@dataclass(frozen=True)
class FlashOptions:
    method: str = "full"
    image: str = NANO.default_image
    build_dir: Path | None = None  # the kas build dir holding tmp/deploy
    package: Path | None = None  # a tegraflash tarball, instead of the one from the build
    sd_image: Path | None = None  # write this SD image instead of building one
    device: str | None = None
    force_device: str | None = None
    yes: bool = False  # non-interactive confirmation for a device that passed every check
    output: Path | None = None  # where the SD image from dosdcard.sh is kept
    dry_run: bool = False
    root: Path = Path("/")  # prefix for /sys, /proc and /dev: tests point it at fixtures
    # The node's server, token, role and labels, written onto its data partition (tools/provision.py).
    provisioning: provision.Provisioning = provision.Provisioning()


def privileged(argv: Sequence[str], euid: int) -> list[str]:
    """USB recovery flashing and raw disk writes need root: sudo when we are not."""
    return list(argv) if euid == 0 else ["sudo", *argv]


def deploy_dir(options: FlashOptions) -> Path:
    build_dir = options.build_dir or BUILD_ROOT / "jetson-nano" / "build"
    return build_dir / "tmp" / "deploy" / "images" / NANO.yocto_machine


def tegraflash_package(options: FlashOptions) -> Path:
    if options.package is not None:
        if not options.package.is_file():
            raise FlashError(f"--package {options.package} does not exist")
        return options.package
    candidate = deploy_dir(options) / f"{options.image}-{NANO.yocto_machine}.tegraflash.tar.gz"
    if not candidate.is_file():
        raise FlashError(
            f"no tegraflash package at {candidate}; build it first with "
            f"`./task build --machine jetson-nano --target {options.image}` "
            "(or pass --package PATH)"
        )
    return candidate


def bmaptool_command(image: Path, device_file: Path, euid: int) -> process.Command:
    """bmaptool skips unused blocks when a .bmap sits beside the image."""
    bmap = image.with_name(image.name + ".bmap")
    if not bmap.exists():
        bmap = image.with_suffix(".bmap")
    bmap_args = ["--bmap", str(bmap)] if bmap.exists() else ["--nobmap"]
    return process.Command(privileged(["bmaptool", "copy", *bmap_args, str(image), str(device_file)], euid))


def ask_typed_confirmation(device: blockdev.BlockDevice, read: Callable[[str], str] | None = None) -> bool:
    answer = (read or input)(f"Everything on {device.path} will be destroyed. Type {device.path} to go on: ")
    return answer.strip() == device.path


def inspect_target(
    options: FlashOptions, image_size: int
) -> tuple[blockdev.BlockDevice, list[blockdev.Refusal]]:
    """Read the device named by --device, show it, and list what speaks against writing it."""
    assert options.device is not None
    name = blockdev.normalise_device_path(options.device)
    try:
        device = blockdev.read_block_device(name, options.root)
    except FileNotFoundError as missing:
        raise FlashError(f"{missing}; list disks with `lsblk -d -o NAME,SIZE,MODEL,TRAN,RM`") from None
    if options.force_device is not None and blockdev.normalise_device_path(options.force_device) != name:
        raise FlashError(
            f"--force-device {options.force_device} does not name the target --device {options.device}; "
            "name the same device in both"
        )
    host = blockdev.read_host_state(options.root)
    console.step("target device")
    for line in blockdev.describe(device, host, console.human_size):
        console.info(line)
    refusals = blockdev.refusals_for(device, image_size, host)
    for refusal in refusals:
        console.info(f"- {refusal.reason}")
    return device, refusals


def refuse_unsafe_target(options: FlashOptions, image_size: int) -> blockdev.BlockDevice:
    """Early check before slow work: refusals that no typed confirmation could lift."""
    device, refusals = inspect_target(options, image_size)
    try:
        blockdev.decide(device, refusals, options.force_device, confirmed_by_typing=True)
    except blockdev.UnsafeTarget as unsafe:
        raise FlashError(str(unsafe)) from None
    return device


def check_target_device(
    options: FlashOptions,
    image_size: int,
    interactive: bool,
    read: Callable[[str], str] | None = None,
) -> blockdev.BlockDevice:
    """Show the device, apply the safety policy, get confirmation. Raises FlashError."""
    device, refusals = inspect_target(options, image_size)
    forced = options.force_device is not None
    # Unforced writes are confirmed by typing the path; --yes stands in for that only
    # when nothing at all speaks against the device.
    wants_typing = not forced and (bool(refusals) or not options.yes)
    typed = False
    if wants_typing and interactive and not options.dry_run:
        try:
            blockdev.decide(device, refusals, options.force_device, confirmed_by_typing=True)
        except blockdev.UnsafeTarget as unsafe:
            raise FlashError(str(unsafe)) from None
        typed = ask_typed_confirmation(device, read)
        if not typed:
            raise FlashError(f"not confirmed; nothing was written to {device.path}")
    try:
        blockdev.decide(device, refusals, options.force_device, typed)
    except blockdev.UnsafeTarget as unsafe:
        raise FlashError(str(unsafe)) from None
    if wants_typing and not typed and not options.dry_run:
        raise FlashError(
            f"writing {device.path} needs confirmation: run interactively and type the device path, "
            f"or pass --yes (or --force-device {device.path})"
        )
    return device


def write_sd_image(options: FlashOptions, image: Path, euid: int, interactive: bool) -> Path:
    if not image.is_file() and not options.dry_run:
        raise FlashError(f"SD image {image} does not exist")
    size = image.stat().st_size if image.exists() else 0
    device = check_target_device(options, size, interactive)
    device_file = options.root / "dev" / device.name
    console.step(f"writing {image.name} to {device.path}")
    try:
        process.run(bmaptool_command(image, device_file, euid), dry_run=options.dry_run)
    except process.CommandFailed as failure:
        raise FlashError(
            f"bmaptool failed ({failure.returncode}); {device.path} may be partly written: write it again"
        ) from None
    return device_file


def unpack(package: Path, workdir: Path, dry_run: bool) -> None:
    console.step(f"unpacking {package.name}")
    # tar, not a GUI tool or Python's tarfile: the package relies on tar keeping modes/links.
    process.run(process.Command(["tar", "-xzf", str(package), "-C", str(workdir)]), dry_run=dry_run)


def find_board(options: FlashOptions, target: usb.RecoveryTarget) -> usb.RecoveryBoard | None:
    """The one board of target in recovery mode; None on a --dry-run that finds none."""
    console.step(f"looking for a {target.name} in USB recovery mode")
    try:
        board = usb.select_recovery_board(usb.find_recovery_boards(options.root), target)
    except usb.NotOneBoardInRecovery as missing:
        if not options.dry_run:
            raise FlashError(str(missing)) from None
        console.warn(f"{missing} (continuing: --dry-run)")
        return None
    console.info(f"found {board.describe()}")
    return board


def flash_over_usb(options: FlashOptions, board: usb.RecoveryBoard | None, workdir: Path, euid: int) -> str:
    argv = ["./doflash.sh", *(["--spi-only"] if options.method == "spi-only" else [])]
    console.step("flashing over USB (doflash.sh; takes several minutes, keep the board connected)")
    try:
        process.run(process.Command(privileged(argv, euid), cwd=workdir), dry_run=options.dry_run)
    except process.CommandFailed as failure:
        raise FlashError(
            f"doflash.sh failed with exit code {failure.returncode}; put the board back in recovery "
            "mode, check the USB cable (no hub, no VM) and run again"
        ) from None
    port = f"at USB port {board.sysfs_name}" if board else "in recovery mode (none is connected now)"
    return f"{'would flash' if options.dry_run else 'flashed'} ({options.method}) the Nano {port}"


def make_sd_image(options: FlashOptions, workdir: Path) -> Path:
    console.step("making the SD card image (dosdcard.sh)")
    try:
        process.run(process.Command(["./dosdcard.sh"], cwd=workdir), dry_run=options.dry_run)
    except process.CommandFailed as failure:
        raise FlashError(f"dosdcard.sh failed with exit code {failure.returncode}") from None
    if options.dry_run:
        return workdir / f"{options.image}.sdcard"
    made = sorted(workdir.glob("*.sdcard"), key=lambda p: p.stat().st_mtime)
    if not made:
        raise FlashError(f"dosdcard.sh finished but left no *.sdcard image in {workdir}")
    return made[-1]


def run_flash(
    options: FlashOptions, euid: int | None = None, interactive: bool | None = None
) -> list[str]:
    """Run the chosen method; returns summary lines. Raises FlashError, writing nothing
    to a device that fails the safety checks."""
    euid = os.geteuid() if euid is None else euid
    interactive = sys.stdin.isatty() if interactive is None else interactive
    results: list[str] = []
    token = _provisioning_token(options)
    if options.sd_image is not None:
        if not options.device:
            raise FlashError("--sd-image needs --device /dev/sdX (the SD card to write)")
        _check_provisioning_role(options, provision.manifest_beside(options.sd_image))
        written = write_sd_image(options, options.sd_image, euid, interactive)
        results = [f"{'would write' if options.dry_run else 'wrote'} {options.sd_image} to /dev/{written.name}"]
        return results + _provision_device(options, options.sd_image, written, token, euid)
    if options.method not in METHODS:
        raise FlashError(f"unknown --method {options.method!r}; choose one of: {', '.join(METHODS)}")
    if options.provisioning.wanted and options.method == "spi-only":
        raise FlashError("--method spi-only writes the boot firmware only: provisioning goes with the method that "
                         "writes the data partition (full, or sdcard --device)")
    if options.provisioning.wanted and options.method == "sdcard" and not options.device:
        raise FlashError("provisioning is written onto the card, never into a kept SD image: give --device /dev/sdX")
    package = tegraflash_package(options)
    _check_provisioning_role(options, provision.manifest_beside(package))
    if options.method == "sdcard" and options.device:
        # Refuse an unsafe device now, before minutes of dosdcard.sh; size is checked later.
        refuse_unsafe_target(options, image_size=0)
    over_usb = options.method in ("full", "spi-only")
    board = find_board(options, usb.NANO) if over_usb else None
    with tempfile.TemporaryDirectory(prefix="gpu-k8s-flash-") as temp:
        workdir = Path(temp)
        unpack(package, workdir, options.dry_run)
        if over_usb and options.provisioning.wanted:
            results.append(_provision_package(options, workdir, token))
        if over_usb:
            results.append(flash_over_usb(options, board, workdir, euid))
        else:
            sd_image = make_sd_image(options, workdir)
            if options.device:
                written = write_sd_image(options, sd_image, euid, interactive)
                results.append(f"{'would write' if options.dry_run else 'wrote'} the SD image to {options.device}")
                results += _provision_device(options, sd_image, written, token, euid)
            kept = options.output or deploy_dir(options) / f"{options.image}-{NANO.yocto_machine}.sdcard"
            if options.dry_run:
                console.info(f"would keep the SD image as {kept}")
            else:
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(sd_image), kept)
                results.append(f"SD image: {kept} ({console.human_size(kept.stat().st_size)})")
    return results


# ---------------------------------------------------------------- provisioning (tools/provision.py)


def _provisioning_token(options: FlashOptions) -> str:
    """Every provisioning option checked before anything is unpacked or written."""
    if not options.provisioning.wanted:
        return ""
    try:
        return provision.validate(options.provisioning)
    except provision.ProvisionError as error:
        raise FlashError(str(error)) from None


def _check_provisioning_role(options: FlashOptions, manifest: Path | None) -> None:
    try:
        provision.check_role(options.provisioning, manifest)
    except provision.ProvisionError as error:
        raise FlashError(str(error)) from None


def _provision_package(options: FlashOptions, workdir: Path, token: str) -> str:
    console.step("writing the node's provisioning into the data partition image")
    try:
        return provision.into_unpacked_package(workdir, options.provisioning, token, options.dry_run)
    except provision.ProvisionError as error:
        raise FlashError(f"{error}; nothing was flashed") from None


def _provision_device(options: FlashOptions, image: Path, written: Path, token: str, euid: int) -> list[str]:
    if not options.provisioning.wanted:
        return []
    console.step(f"writing the node's provisioning onto {written}")
    try:
        return [provision.onto_device(image, written, options.provisioning, token, privileged([], euid),
                                      options.dry_run)]
    except provision.ProvisionError as error:
        raise FlashError(f"{error}; the image was written, the node is not provisioned: run again, or write "
                         "/etc/rancher/k3s/config.yaml on it") from None
