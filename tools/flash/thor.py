"""`flash --machine jetson-agx-thor[-t4000]`: put a built image on a Jetson AGX Thor the way
meta-tegra wrynose (L4T R39.2) documents it (docs/Flashing.md there): unpack the
.tegraflash-tar.zst package, then `./initrd-flash` with the board in USB recovery mode.

On Thor (the package's CHIPID 0x26) initrd-flash hands over to NVIDIA's unified flash: it signs
and stages the QSPI and NVMe partitions inside the unpacked package, boots the board over USB
into a flashing initrd and pushes the images to it (flash_bsp_images.py), and the board writes
its own QSPI and NVMe. Unlike the Orin's flow the board's storage is never exported to this host
as a USB drive, and meta-tegra's dosdcard.sh / doexternal.sh are for the Orin only: no block
device of this host is ever written, so --device, --force-device, --sd-image and the
sdcard/external methods are refused. The board stays in the flashing initrd until it is power
cycled or reset (docs/Flashing.md, step 4). Provisioning goes into the package's data image first,
as on the Orin (tools/flash/provision.py). On Thor initrd-flash exits 0 whatever the unified flash did,
so the unified flash's own result line in initrd-flash's log decides whether the board was flashed
(tools/flash/initrd_flash.py, the reader the Orin shares)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools.flash import hosttools, initrd_flash, orin, usb
from tools.flash.flash import (
    FlashError,
    FlashOptions,
    FlashUsageError,
    find_board,
    provision_package,
    provisioning_token,
    refuse_provisioning_nowhere,
    require_host_tools,
    with_method,
)
from tools.flash.provision import ProvisionError, check_role, manifest_beside
from tools.image.build import MACHINES

# NVIDIA's Jetson AGX Thor devkit user guide: three buttons (Power, Force Recovery, Reset) and
# a USB-C port marked for force recovery; the debug USB-C port under the lid carries the serial
# console (meta-tegra docs/Flashing.md).
THOR_RECOVERY = (
    "put the AGX Thor devkit in recovery mode: with it powered off, hold the Force Recovery button "
    "(the middle one), press and release Power, release Force Recovery after two seconds (or, while it "
    "runs, hold Force Recovery and press Reset); connect the USB-C port NVIDIA marks for force recovery "
    "straight to this host (no hub, no VM), then check with `lsusb -d 0955:`"
)
THOR_RESET = ("power-cycle the Thor (or press Reset) now: it stays in the flashing initrd until it is "
              "reset, then boots the new image (meta-tegra docs/Flashing.md, step 4)")

@dataclass(frozen=True)
class ThorTarget:
    """What flashing needs to know of a `--machine` that builds a Thor image."""

    yocto_machine: str
    product_ids: frozenset[str]  # USB ids in recovery mode of the module this MACHINE is for
    recovery_howto: str = THOR_RECOVERY

    @property
    def recovery(self) -> usb.RecoveryTarget:
        """What looking for this module in USB recovery mode accepts and says."""
        return usb.module_target(self.yocto_machine, self.product_ids, usb.THOR_RECOVERY_MODELS,
                                 f"this image is for another module; {which_machine_for_which_module()}",
                                 self.recovery_howto)


# Keyed by the Yocto MACHINE of the kas build (a kas override may change it). meta-tegra's
# tegra-flash-helper.sh also stops when the board's SKU is not the package's (BOARDSKU 0008 for
# the T5000, 0000 for the T4000), but only after signing; the USB id refuses before anything runs.
THOR_TARGETS: dict[str, ThorTarget] = {
    "jetson-agx-thor-devkit": ThorTarget("jetson-agx-thor-devkit", frozenset({"7026"})),
    "jetson-agx-thor-t4000": ThorTarget("jetson-agx-thor-t4000", frozenset({"7226"})),
}

METHODS = {
    "full": "initrd-flash over USB in recovery mode (NVIDIA's unified flash): boot firmware to QSPI and the "
    "rootfs, both slots and the data partition to the NVMe drive in the board",
    "spi-only": "initrd-flash --qspi-only: only the QSPI boot firmware",
    "external-only": "initrd-flash --external-only: only the NVMe drive (boot firmware already current)",
}
# The Orin's ways of writing a drive attached to this host: meta-tegra documents them for the
# Orin only, and on Thor no host drive is written at all.
HOST_DRIVE_METHODS = ("sdcard", "external")

# Host programs meta-tegra's Thor flashing needs (docs/Flashing.md: dtc, cpp, Python 3 for
# NVIDIA's unified flash scripts), with their Debian packages; zstd unpacks the package.
HOST_TOOLS = (
    hosttools.ZSTD,
    hosttools.HostTool("dtc", "device-tree-compiler"),
    hosttools.HostTool("cpp", "cpp"),
    hosttools.HostTool("python3", "python3"),
)


def which_machine_for_which_module() -> str:
    """'--machine jetson-agx-thor for a Jetson AGX Thor T5000 (...) (0955:7026), ...'."""
    names = {target.yocto_machine: name for name, target in MACHINES.items()}
    return "build and flash " + ", ".join(
        f"--machine {names.get(target.yocto_machine, target.yocto_machine)} for a "
        f"{usb.THOR_RECOVERY_MODELS[pid]} ({usb.NVIDIA_VENDOR_ID}:{pid})"
        for target in THOR_TARGETS.values() for pid in sorted(target.product_ids)
    )


def thor_target(yocto_machine: str) -> ThorTarget:
    try:
        return THOR_TARGETS[yocto_machine]
    except KeyError:
        raise FlashError(
            f"no flashing support for MACHINE {yocto_machine!r}; supported Thor machines: {', '.join(THOR_TARGETS)}"
        ) from None


def is_thor(yocto_machine: str) -> bool:
    return yocto_machine in THOR_TARGETS


def refuse_host_writes(options: FlashOptions, target: ThorTarget) -> None:
    """Thor is flashed over USB only: every option that names something of this host to write."""
    why = (f"{target.yocto_machine} is flashed over USB only: the board writes its own QSPI and NVMe, and "
           "no drive of this host is written (meta-tegra's dosdcard.sh and doexternal.sh are for the Orin)")
    if options.sd_image is not None:
        raise FlashUsageError(f"--sd-image: {why}; leave it out and put the board in recovery mode")
    if options.device or options.force_device:
        raise FlashUsageError(f"--device/--force-device: {why}; leave them out and put the board in recovery mode")
    if options.output is not None:
        raise FlashUsageError(f"--output keeps an SD image, which a Thor has none of: {why}")
    if options.method in HOST_DRIVE_METHODS:
        raise FlashUsageError(f"--method {options.method}: {why}; use --method full, spi-only or external-only")


def check_method(options: FlashOptions) -> None:
    if options.method not in METHODS:
        raise FlashUsageError(f"unknown --method {options.method!r} for a Thor; choose one of: {', '.join(METHODS)}")


def run_thor_flash(options: FlashOptions, machine: str) -> list[str]:
    """Flash a Thor (`--machine` NAME of tools/image/build.py); returns summary lines. Raises
    FlashError having run no script when an option, the board, the host or the package is not
    right; nothing of this host but a temporary directory is ever written. With provisioning,
    the package's data partition image gets it first (tools/flash/provision.py)."""
    target = thor_target(MACHINES[machine].yocto_machine)
    token = provisioning_token(options)
    refuse_host_writes(options, target)
    options = with_method(options)
    check_method(options)
    refuse_provisioning_nowhere(options)
    package = orin.tegraflash_package(options, machine)
    try:
        check_role(options.provisioning, manifest_beside(package), machine)
    except ProvisionError as error:
        raise FlashError(str(error)) from None
    require_host_tools(options, HOST_TOOLS, "meta-tegra's Thor flashing")
    board = find_board(options, target.recovery)
    with tempfile.TemporaryDirectory(prefix="gpu-k8s-flash-") as temp:
        workdir = Path(temp)
        # A package made for an Orin, or for the other Thor module, is refused here, unflashed.
        orin.open_package(options, package, workdir, initrd_flash.THOR, target.yocto_machine, "nvme")
        provisioned = ([provision_package(options, package, workdir, token, machine)]
                       if options.provisioning.wanted else [])
        flashed = initrd_flash.run(options, board, workdir, initrd_flash.THOR)
    return [*provisioned, *flashed, *([] if options.dry_run or board is None else [THOR_RESET])]
