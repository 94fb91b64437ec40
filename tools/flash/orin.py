"""`flash --machine jetson-orin-nano`: put a built image on a Jetson Orin the way meta-tegra
wrynose (L4T R39.2) documents it (docs/Flashing.md there): unpack the .tegraflash-tar.zst
package, then `./initrd-flash` over USB with the board in recovery mode (boot firmware to
QSPI, the rootfs to the NVMe drive, SD card or eMMC the MACHINE roots on), or `./dosdcard.sh` /
`./doexternal.sh` to write the SD card or NVMe drive attached to this host, which pass the same
safety checks as the Nano's SD card. initrd-flash's own result line decides whether the board
was flashed (tools/flash/initrd_flash.py)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools import console, process
from tools.flash import hosttools, initrd_flash, make_sdcard, package_checks, usb
from tools.flash.flash import (
    FlashError,
    FlashOptions,
    FlashUsageError,
    check_device_argument,
    check_target_device,
    checked_package,
    find_board,
    provision_package,
    provisioning_token,
    refuse_provisioning_nowhere,
    refuse_unsafe_target,
    require_host_tools,
    stop_or_warn,
    unpack_with,
    with_method,
    write_image_file,
)
from tools.flash.provision import ProvisionError, check_role, manifest_beside
from tools.image.build import MACHINES
from tools.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "meta-gpu-k8s" / "lib"))
from gpu_k8s.tegra_sdcard import ORIN_SD_CARD_SIZE  # the layer's lib, as tools/image/preflight.py imports it

# Where a MACHINE's rootfs lives (meta-tegra wrynose 727633de, conf/machine/): "nvme" (a
# TNSPEC_BOOTDEV on nvme0n1: an external rootfs drive, external-flash.xml.in and doexternal.sh in
# the package), "sdcard" (an SD device in flash.xml.in: dosdcard.sh), "emmc" (the module's eMMC,
# TNSPEC_BOOTDEV mmcblk0p1 and flash_t234_qspi_sdmmc*.xml: only initrd-flash writes it).
STORAGE_NAMES = {"nvme": "NVMe drive", "sdcard": "SD card", "emmc": "eMMC"}


@dataclass(frozen=True)
class OrinTarget:
    """What flashing needs to know of a `--machine` that builds an Orin image."""

    yocto_machine: str
    product_ids: frozenset[str]  # USB ids in recovery mode of the module this MACHINE is for
    storage: str  # "nvme", "sdcard" or "emmc": where the rootfs goes (STORAGE_NAMES)
    recovery_howto: str
    sd_card_size: str | None = None  # dosdcard.sh -s for an SD image: the card the layer lays out for

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

# Keyed by the Yocto MACHINE of the kas build (a kas override may change it). The storage is
# meta-tegra's: jetson-orin-nano-devkit-nvme sets TNSPEC_BOOTDEV nvme0n1p1 and
# flash_l4t_t234_nvme.xml; jetson-orin-nano-devkit keeps mmcblk0p1 with flash_t234_qspi_sd.xml;
# jetson-agx-orin-devkit (agx-orin.inc) keeps the default mmcblk0p1 with flash_t234_qspi_sdmmc.xml,
# its 64 GB eMMC, so its package has no external layout and no doexternal.sh, and initrd-flash
# (EXTERNAL_ROOTFS_DRIVE=0) writes flash.xml.in's eMMC user area (ROOTFS_DEVICE mmcblk0).
ORIN_TARGETS: dict[str, OrinTarget] = {
    "jetson-orin-nano-devkit-nvme": OrinTarget(
        "jetson-orin-nano-devkit-nvme", ORIN_NANO_DEVKIT_IDS, "nvme", ORIN_NANO_RECOVERY),
    "jetson-orin-nano-devkit": OrinTarget(
        "jetson-orin-nano-devkit", ORIN_NANO_DEVKIT_IDS, "sdcard", ORIN_NANO_RECOVERY, ORIN_SD_CARD_SIZE),
    "jetson-agx-orin-devkit": OrinTarget("jetson-agx-orin-devkit", AGX_ORIN_DEVKIT_IDS, "emmc", AGX_ORIN_RECOVERY),
}

METHODS = {
    "full": "initrd-flash over USB in recovery mode: boot firmware to QSPI and the rootfs to the "
    "NVMe drive, SD card or eMMC the board roots on",
    "spi-only": "initrd-flash --qspi-only: only the QSPI boot firmware",
    "external-only": "initrd-flash --external-only: only the rootfs storage (boot firmware already current)",
    "sdcard": "dosdcard.sh: write the SD card (jetson-orin-nano-devkit) in a reader on this host; "
    "needs --device, or makes an SD image file without it",
    "external": "doexternal.sh: write the NVMe drive (NVMe machines) attached to this host by a USB "
    "adapter; needs --device",
}
USB_METHODS = ("full", "spi-only", "external-only")

# Host programs meta-tegra's Orin flashing needs (docs/Flashing.md), with their Debian packages.
HOST_TOOLS = (
    hosttools.ZSTD,  # unpacking the .tegraflash-tar.zst package
    hosttools.HostTool("dtc", "device-tree-compiler"),
    hosttools.HostTool("cpp", "cpp"),
    hosttools.HostTool("sgdisk", "gdisk"),
)
USB_HOST_TOOLS = (hosttools.HostTool("udisksctl", "udisks2"),)  # initrd-flash mounts the board's USB storage
RECOMMENDED_TOOLS = (hosttools.BMAPTOOL,)  # make-sdcard falls back to dd without it: very slow


def orin_target(yocto_machine: str) -> OrinTarget:
    try:
        return ORIN_TARGETS[yocto_machine]
    except KeyError:
        raise FlashError(
            f"no flashing support for MACHINE {yocto_machine!r}; supported Orin machines: "
            f"{', '.join(ORIN_TARGETS)}"
        ) from None


def machine_name(yocto_machine: str) -> str:
    """The --machine that builds a Yocto MACHINE (tools/image/build.py), else the MACHINE itself."""
    return next((name for name, built in MACHINES.items() if built.yocto_machine == yocto_machine), yocto_machine)


def tegraflash_package(options: FlashOptions, machine: str) -> Path:
    """The .tegraflash-tar.zst to flash (the Orin's and the Thor's), checked to be zstd before
    anything else reads it."""
    return checked_package(options, machine, "tegraflash-tar.zst", "zstd",
                           "a Nano's package is flashed with --machine jetson-nano")


def check_host_tools(options: FlashOptions, over_usb: bool) -> None:
    # dosdcard.sh/doexternal.sh sign and lay out partitions on this host: no udisksctl.
    require_host_tools(options, HOST_TOOLS + (USB_HOST_TOOLS if over_usb else ()), "meta-tegra's Orin flashing")
    for tool in hosttools.missing(RECOMMENDED_TOOLS):
        console.warn(f"{tool.named()} is missing: writing the rootfs will be very slow")


def open_package(options: FlashOptions, package: Path, workdir: Path, chip: initrd_flash.Chip,
                 yocto_machine: str, storage: str) -> None:
    """Unpack the package into workdir (a dry run: only its layouts, .env.initrd-flash and
    scripts), then check it was made for this chip and MACHINE and roots where flash takes that
    MACHINE to root (`storage`), before anything is written."""
    # GNU tar (with zstd) as meta-tegra asks: the package relies on tar keeping modes and links.
    unpack_with(["tar", "--zstd", "-xf", str(package), "-C", str(workdir)], package, options.dry_run)

    def fix(made_for: str) -> str:
        return (f"flash it with --machine {machine_name(made_for)}, or pass the package ./task build --machine "
                f"{machine_name(yocto_machine)} made")

    try:
        if options.dry_run:
            package_checks.peek(package, workdir)
        package_checks.check_made_for(workdir, chip.chip_id, yocto_machine, fix)
    except package_checks.PackageError as wrong:
        raise FlashError(str(wrong)) from None
    found = package_checks.rootfs_storage(workdir)
    if found is not None and found != storage:
        raise FlashError(f"this package writes the rootfs to the {STORAGE_NAMES.get(found, found)} (its "
                         f".env.initrd-flash and flash.xml.in), but flash takes {yocto_machine} to root on its "
                         f"{STORAGE_NAMES.get(storage, storage)}: nothing was flashed; the package and "
                         "tools/flash/orin.py disagree about meta-tegra's machine, report it")


def layout_needs(workdir: Path, layout: str) -> int:
    """Bytes make-sdcard needs for the package's layout (every partition of its rootfs device);
    0 when the package has no such layout (the script then says so)."""
    path = workdir / layout
    if not path.is_file():
        return 0
    try:
        return make_sdcard.needed_bytes(path.read_text(errors="replace"))
    except make_sdcard.LayoutSizeError as error:
        raise FlashError(f"cannot size {layout} of this package: {error}") from None


def needs_message(needed: int, layout: str) -> str:
    return (f"the layout ({layout}: every partition of its rootfs device, as make-sdcard lays them out) needs "
            f"{make_sdcard.gigabytes(needed)}: use a card or drive of {make_sdcard.card_to_buy(needed)} GB or more")


def write_with_script(options: FlashOptions, target: OrinTarget, workdir: Path, interactive: bool) -> str:
    script, layout = ("./dosdcard.sh", "flash.xml.in") if options.method == "sdcard" else (
        "./doexternal.sh", "external-flash.xml.in")
    needed = layout_needs(workdir, layout)
    device = check_target_device(options, needed, interactive, larger=needs_message(needed, layout))
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


def check_sd_image_size(options: FlashOptions, size: str, workdir: Path) -> None:
    """The SD image dosdcard.sh makes is `-s` big: the whole layout must fit in it."""
    needed = layout_needs(workdir, "flash.xml.in")
    room = make_sdcard.card_sectors(size) * make_sdcard.SECTOR_BYTES
    if needed > room:
        stop_or_warn(options, f"the SD image would be {size} ({make_sdcard.gigabytes(room)} after make-sdcard's 1 %), "
                     f"but {needs_message(needed, 'flash.xml.in')}; the layer lays the SD-card Orin out for "
                     f"{size} (meta-gpu-k8s/lib/gpu_k8s/tegra_sdcard.py): a build with larger root slots needs "
                     "that size raised too")


def make_sd_image(options: FlashOptions, target: OrinTarget, workdir: Path, package: Path) -> str:
    size = target.sd_card_size or ORIN_SD_CARD_SIZE
    check_sd_image_size(options, size, workdir)
    console.step(f"making the SD card image (dosdcard.sh, a {size} card)")
    argv = ["./dosdcard.sh", "-y", "-s", size, "-b", options.image]
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


# What each storage is written with, besides initrd-flash over USB (full, spi-only, external-only).
HOST_METHOD = {"nvme": "external", "sdcard": "sdcard"}


def check_method(options: FlashOptions, target: OrinTarget) -> None:
    if options.method not in METHODS:
        raise FlashUsageError(f"unknown --method {options.method!r} for an Orin; choose one of: {', '.join(METHODS)}")
    if options.method in HOST_METHOD.values() and HOST_METHOD.get(target.storage) != options.method:
        where = STORAGE_NAMES[target.storage]
        if target.storage == "emmc":
            instead = ("which only initrd-flash writes, over USB with the board in recovery mode (no dosdcard.sh or "
                       "doexternal.sh in its package): use --method full, or external-only for the eMMC alone")
        else:
            instead = f"use --method {HOST_METHOD[target.storage]} (its {where} on this host) or --method full"
        raise FlashUsageError(f"{target.yocto_machine} keeps its rootfs on its {where}, not "
                              f"{'an SD card' if options.method == 'sdcard' else 'an NVMe drive'}: {instead}")
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
    options = with_method(options)
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
        open_package(options, package, workdir, initrd_flash.ORIN, target.yocto_machine, target.storage)
        provisioned = ([provision_package(options, package, workdir, token, machine)]
                       if options.provisioning.wanted else [])
        if over_usb:
            return [*provisioned, *initrd_flash.run(options, board, workdir, initrd_flash.ORIN)]
        if options.device:
            return [*provisioned, write_with_script(options, target, workdir, interactive)]
        return [make_sd_image(options, target, workdir, package)]


def is_orin(yocto_machine: str) -> bool:
    return yocto_machine in ORIN_TARGETS
