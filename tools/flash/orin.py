"""`flash --machine jetson-orin-nano`: put a built image on a Jetson Orin the way meta-tegra
wrynose (L4T R39.2) documents it (docs/Flashing.md there): unpack the .tegraflash-tar.zst
package, then `./initrd-flash` over USB with the board in recovery mode (boot firmware to
QSPI, rootfs to NVMe or SD), or `./dosdcard.sh` / `./doexternal.sh` to write the SD card or
NVMe drive attached to this host, which pass the same safety checks as the Nano's SD card."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools import console, process
from tools.flash import usb
from tools.flash.flash import (
    FlashError,
    FlashOptions,
    FlashUsageError,
    check_device_argument,
    check_target_device,
    find_board,
    find_built,
    provision_package,
    provisioning_token,
    refuse_provisioning_nowhere,
    refuse_unsafe_target,
    write_image_file,
)
from tools.flash.provision import ProvisionError, check_role, manifest_beside
from tools.image.build import MACHINES


@dataclass(frozen=True)
class OrinTarget:
    """What flashing needs to know of a `--machine` that builds an Orin image."""

    yocto_machine: str
    product_ids: frozenset[str]  # USB ids in recovery mode of the module this MACHINE is for
    storage: str  # "nvme" or "sdcard": where the rootfs goes
    recovery_howto: str

    @property
    def recovery(self) -> usb.RecoveryTarget:
        """What looking for this module in USB recovery mode accepts and says."""
        return usb.module_target(self.yocto_machine, self.product_ids, usb.ORIN_RECOVERY_MODELS,
                                 "this image is for another module; build for its MACHINE (docs/layer.md, Jetson Orin)",
                                 self.recovery_howto)


ORIN_NANO_RECOVERY = (
    "put the Orin Nano devkit in recovery mode: power off, jumper FC REC to GND on the button "
    "header under the module (J14 pins 10 and 9 on the p3768 carrier), power on, connect its "
    "USB-C port straight to this host (no hub, no VM), then check with `lsusb -d 0955:`"
)
AGX_ORIN_RECOVERY = (
    "put the AGX Orin devkit in recovery mode: with it powered off, hold the Force Recovery "
    "button (the middle one) and press Power, release both after two seconds; connect the "
    "USB-C port next to the 40-pin header straight to this host (no hub, no VM), then check "
    "with `lsusb -d 0955:`"
)

ORIN_NANO_DEVKIT_IDS = frozenset({"7523"})  # P3767-0005 (devkit) and -0003 report 7523
AGX_ORIN_DEVKIT_IDS = frozenset({"7023"})

# Keyed by the Yocto MACHINE of the kas build (a kas override may change it).
ORIN_TARGETS: dict[str, OrinTarget] = {
    "jetson-orin-nano-devkit-nvme": OrinTarget(
        "jetson-orin-nano-devkit-nvme", ORIN_NANO_DEVKIT_IDS, "nvme", ORIN_NANO_RECOVERY),
    "jetson-orin-nano-devkit": OrinTarget(
        "jetson-orin-nano-devkit", ORIN_NANO_DEVKIT_IDS, "sdcard", ORIN_NANO_RECOVERY),
    "jetson-agx-orin-devkit": OrinTarget("jetson-agx-orin-devkit", AGX_ORIN_DEVKIT_IDS, "nvme", AGX_ORIN_RECOVERY),
}

METHODS = {
    "full": "initrd-flash over USB in recovery mode: boot firmware to QSPI and the rootfs to the "
    "NVMe drive or SD card in the board",
    "spi-only": "initrd-flash --qspi-only: only the QSPI boot firmware",
    "external-only": "initrd-flash --external-only: only the rootfs storage (boot firmware already current)",
    "sdcard": "dosdcard.sh: write the SD card (jetson-orin-nano-devkit) in a reader on this host; "
    "needs --device, or makes an SD image file without it",
    "external": "doexternal.sh: write the NVMe drive (NVMe machines) attached to this host by a USB "
    "adapter; needs --device",
}
USB_METHODS = ("full", "spi-only", "external-only")
INITRD_FLASH_ARGS = {"full": [], "spi-only": ["--qspi-only"], "external-only": ["--external-only"]}

# Host programs meta-tegra's Orin flashing needs (docs/Flashing.md), with their Debian packages.
HOST_TOOLS = {
    "zstd": "zstd",  # unpacking the .tegraflash-tar.zst package
    "dtc": "device-tree-compiler",
    "cpp": "cpp",
    "sgdisk": "gdisk",
    "udisksctl": "udisks2",
}
RECOMMENDED_TOOLS = {"bmaptool": "bmap-tools"}  # without it a large rootfs takes very long


def orin_target(yocto_machine: str) -> OrinTarget:
    try:
        return ORIN_TARGETS[yocto_machine]
    except KeyError:
        raise FlashError(
            f"no flashing support for MACHINE {yocto_machine!r}; supported Orin machines: "
            f"{', '.join(ORIN_TARGETS)}"
        ) from None


def tegraflash_package(options: FlashOptions, machine: str) -> Path:
    if options.package is not None:
        if not options.package.is_file():
            raise FlashError(f"--package {options.package} does not exist")
        return options.package
    return find_built(machine, options, "tegraflash-tar.zst", "tegraflash package", "--package PATH")


def missing_host_tools(methods_need_usb: bool) -> list[str]:
    wanted = dict(HOST_TOOLS)
    if not methods_need_usb:
        # dosdcard.sh/doexternal.sh sign and lay out partitions on this host: no udisksctl.
        wanted.pop("udisksctl")
    return [f"{tool} (apt-get install {package})" for tool, package in wanted.items() if shutil.which(tool) is None]


def check_host_tools(options: FlashOptions, over_usb: bool) -> None:
    missing = missing_host_tools(over_usb)
    if missing:
        message = "meta-tegra's Orin flashing needs " + ", ".join(missing)
        if not options.dry_run:
            raise FlashError(message)
        console.warn(f"{message} (continuing: --dry-run)")
    for tool, package in RECOMMENDED_TOOLS.items():
        if shutil.which(tool) is None:
            console.warn(f"{tool} is missing (apt-get install {package}): writing the rootfs will be very slow")


def unpack(package: Path, workdir: Path, dry_run: bool) -> None:
    console.step(f"unpacking {package.name}")
    # GNU tar (with zstd) as meta-tegra asks: the package relies on tar keeping modes and links.
    process.run(process.Command(["tar", "--zstd", "-xf", str(package), "-C", str(workdir)]), dry_run=dry_run)


# What initrd-flash leaves in the directory it runs in: its own log (log.initrd-flash.<date>) and
# the logs the board sends back (device-logs-<date>/, the Orin's flow).
INITRD_FLASH_LOGS = ("log.initrd-flash.*", "device-logs-*")


def keep_flash_logs(workdir: Path) -> Path | None:
    """Copies initrd-flash's logs out of the unpacked package, which is a temporary directory
    removed when flashing ends, into a directory of their own that stays; None when it left none."""
    found = sorted(path for pattern in INITRD_FLASH_LOGS for path in workdir.glob(pattern))
    if not found:
        return None
    kept = Path(tempfile.mkdtemp(prefix="gpu-k8s-flash-logs-"))
    for path in found:
        if path.is_dir():
            shutil.copytree(path, kept / path.name)
        else:
            shutil.copy2(path, kept / path.name)
    return kept


def where_logs_are(kept: Path | None) -> str:
    return f"its logs are kept in {kept}" if kept else "it left no log.initrd-flash.* file"


def initrd_flash(options: FlashOptions, board: usb.RecoveryBoard | None, workdir: Path, family: str = "Orin") -> str:
    """meta-tegra's initrd-flash in the unpacked package, on the board's USB port; `family` names
    the board in the summary (the Thor path, tools/flash/thor.py, shares this)."""
    argv = ["./initrd-flash", *INITRD_FLASH_ARGS[options.method]]
    if board is not None:
        # The port we checked, so a second Jetson on this host is never the one flashed.
        argv += ["--usb-instance", board.sysfs_name]
    console.step("flashing over USB (initrd-flash; takes many minutes, keep the board connected)")
    try:
        # initrd-flash calls sudo itself for the steps that need root.
        process.run(process.Command(argv, cwd=workdir), dry_run=options.dry_run)
    except process.CommandFailed as failure:
        # The unpacked package goes with the temporary directory: the logs that say why must not.
        raise FlashError(
            f"initrd-flash failed with exit code {failure.returncode}; {where_logs_are(keep_flash_logs(workdir))} "
            "and say why: put the board back in recovery mode, check the USB cable (no hub, no VM) and run again"
        ) from None
    if board is None:
        return f"(dry run) would flash ({options.method}) the {family} in recovery mode"
    return f"flashed ({options.method}) the {board.model or family} at USB port {board.sysfs_name}"


_ROOTFS_PARTITION = re.compile(r'<partition\b[^>]*\bname="APP(_b)?"')


def rootfs_slots(layout: Path) -> int:
    """How many root filesystem partitions (APP, APP_b) the layout writes: 2 with meta-tegra's
    redundant (A/B) layout."""
    return max(1, len(_ROOTFS_PARTITION.findall(layout.read_text()))) if layout.is_file() else 1


def needed_bytes(options: FlashOptions, workdir: Path, layout: str) -> int:
    """A lower bound for the target's size: the rootfs image once per root slot."""
    rootfs = workdir / f"{options.image}.ext4"
    return rootfs.stat().st_size * rootfs_slots(workdir / layout) if rootfs.is_file() else 0


def write_with_script(options: FlashOptions, target: OrinTarget, workdir: Path, interactive: bool) -> str:
    script, layout = ("./dosdcard.sh", "flash.xml.in") if options.method == "sdcard" else (
        "./doexternal.sh", "external-flash.xml.in")
    device = check_target_device(options, needed_bytes(options, workdir, layout), interactive)
    device_file = options.root / "dev" / device.name
    console.step(f"writing {target.yocto_machine}'s {'SD card' if options.method == 'sdcard' else 'drive'} "
                 f"{device.path} ({script.removeprefix('./')})")
    try:
        # -y: we asked already (typed path, --yes or --force-device); the script sudo-s itself.
        process.run(process.Command([script, "-y", str(device_file)], cwd=workdir), dry_run=options.dry_run)
    except process.CommandFailed as failure:
        raise FlashError(
            f"{script.removeprefix('./')} failed with exit code {failure.returncode}; {device.path} may be "
            "partly written: write it again"
        ) from None
    return f"wrote {options.image} for {target.yocto_machine} to {device.path}"


def make_sd_image(options: FlashOptions, target: OrinTarget, workdir: Path, package: Path) -> str:
    console.step("making the SD card image (dosdcard.sh)")
    argv = ["./dosdcard.sh", "-y", "-s", "32G", "-b", options.image]
    try:
        process.run(process.Command(argv, cwd=workdir), dry_run=options.dry_run)
    except process.CommandFailed as failure:
        raise FlashError(f"dosdcard.sh failed with exit code {failure.returncode}") from None
    made = workdir / f"{options.image}.sdcard"
    kept = options.output or package.parent / f"{options.image}-{target.yocto_machine}.sdcard"
    if options.dry_run:
        console.info(f"would keep the SD image as {kept}")
        return f"(dry run) SD image would be {kept}"
    if not made.is_file():
        raise FlashError(f"dosdcard.sh finished but left no {made.name} in {workdir}")
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(made), kept)
    return f"SD image: {kept} ({console.human_size(kept.stat().st_size)}); write it with --sd-image"


def check_method(options: FlashOptions, target: OrinTarget) -> None:
    if options.method not in METHODS:
        raise FlashUsageError(f"unknown --method {options.method!r} for an Orin; choose one of: {', '.join(METHODS)}")
    if options.method == "sdcard" and target.storage != "sdcard":
        raise FlashUsageError(
            f"{target.yocto_machine} keeps its rootfs on NVMe, not an SD card: use --method external "
            "(drive on this host) or --method full"
        )
    if options.method == "external" and target.storage != "nvme":
        raise FlashUsageError(f"{target.yocto_machine} boots from its SD card: use --method sdcard or --method full")
    if options.method == "external" and not options.device:
        raise FlashUsageError("--method external needs --device /dev/sdX (the NVMe drive in its USB adapter)")
    if options.method in USB_METHODS and options.device:
        raise FlashUsageError(f"--method {options.method} writes the board over USB; --device is only for "
                              "--method sdcard or external")


def run_orin_flash(
    options: FlashOptions, machine: str, interactive: bool | None = None
) -> list[str]:
    """Flash an Orin (`--machine` NAME of tools/image/build.py); returns summary lines. Raises
    FlashError, having written nothing to a device that fails the safety checks and run no
    script when the board, the host or the package is not ready. With provisioning, the
    package's data partition image gets it first (tools/flash/provision.py)."""
    interactive = sys.stdin.isatty() if interactive is None else interactive
    target = orin_target(MACHINES[machine].yocto_machine)
    token = provisioning_token(options)
    if options.sd_image is not None:
        # An SD image made earlier (--method sdcard without --device): the Nano's bmaptool write.
        return write_image_file(options, options.sd_image, os.geteuid(), interactive, token)
    check_method(options, target)
    refuse_provisioning_nowhere(options)
    check_device_argument(options)
    package = tegraflash_package(options, machine)
    try:
        check_role(options.provisioning, manifest_beside(package), machine)
    except ProvisionError as error:
        raise FlashError(str(error)) from None
    over_usb = options.method in USB_METHODS
    if options.device:
        # Refuse an unsafe device now, before unpacking gigabytes; the size is checked later.
        refuse_unsafe_target(options, image_size=0)
    check_host_tools(options, over_usb)
    board = find_board(options, target.recovery) if over_usb else None
    with tempfile.TemporaryDirectory(prefix="gpu-k8s-flash-") as temp:
        workdir = Path(temp)
        unpack(package, workdir, options.dry_run)
        provisioned = ([provision_package(options, package, workdir, token, machine)]
                       if options.provisioning.wanted else [])
        if over_usb:
            return [*provisioned, initrd_flash(options, board, workdir)]
        if options.device:
            return [*provisioned, write_with_script(options, target, workdir, interactive)]
        return [make_sd_image(options, target, workdir, package)]


def is_orin(yocto_machine: str) -> bool:
    return yocto_machine in ORIN_TARGETS
