"""`flash`: put a built image on a Jetson Nano (USB recovery flash), an SD card, or the disk
of an x86-64 node; find what `./task build` made for the machine and role (tools/image/build.py)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tools import console, process
from tools.flash import blockdev, hosttools, package_checks, provision, usb
from tools.image import build
from tools.image.build import MACHINES
from tools.usage import UsageError

NANO_MACHINE = "jetson-nano"
NANO = MACHINES[NANO_MACHINE]

METHODS = {
    "full": "flash everything over USB in recovery mode (doflash.sh): eMMC modules and first boot",
    "spi-only": "flash only the QSPI boot firmware over USB (doflash.sh --spi-only): SD-card devkits",
    "sdcard": "make an SD card image with dosdcard.sh; written to --device when given",
}


class FlashError(Exception):
    """Flashing cannot go ahead or failed; the message names the problem and the fix."""


class FlashUsageError(FlashError, UsageError):
    """Options that cannot go together or name nothing flash can write."""


class DryRunStopped(FlashError):
    """A dry run went through to the end, but a real run would have stopped: exit status 1,
    as build's dry run (the lines are what the dry run showed)."""

    def __init__(self, lines: list[str], stops: list[str]) -> None:
        self.lines = lines
        more = f" (and {len(stops) - 1} more above)" if len(stops) > 1 else ""
        super().__init__(f"dry run: a real flash would stop here: {stops[0]}{more}; fix that and run again")


DEFAULT_METHOD = "full"


@dataclass(frozen=True)
class FlashOptions:
    method: str | None = None  # None: not given (each path's default, full); --sd-image takes none
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
    # The node's server, token, role and labels, written onto its data partition (tools/flash/provision.py).
    provisioning: provision.Provisioning = provision.Provisioning()
    # Where a dry run went on although a real run would stop (stop_or_warn): it then exits 1.
    stops: list[str] = field(default_factory=list, compare=False, repr=False)


def with_method(options: FlashOptions, default: str = DEFAULT_METHOD) -> FlashOptions:
    """--method as given, else the path's default (the dry run's notes go along)."""
    return options if options.method else dataclasses.replace(options, method=default)


def stop_or_warn(options: FlashOptions, message: str) -> None:
    """Where a real run stops: raises FlashError. A dry run says so, goes on to show the rest,
    and ends with exit status 1 (tools/flash/targets.py)."""
    if not options.dry_run:
        raise FlashError(message)
    console.warn(f"{message} (a real run stops here; continuing: --dry-run)")
    options.stops.append(message)


def require_host_tools(options: FlashOptions, tools: Iterable[hosttools.HostTool], needs: str) -> None:
    """Every program the path will run is on PATH, else a refusal naming its package."""
    message = hosttools.missing_message(tools, needs)
    if message:
        stop_or_warn(options, message)


def privileged(argv: Sequence[str], euid: int) -> list[str]:
    """USB recovery flashing and raw disk writes need root: sudo when we are not."""
    return list(argv) if euid == 0 else ["sudo", *argv]


def image_file_names(image: str, yocto_machine: str, suffix: str) -> list[str]:
    """The stable names bitbake gives an image's file: IMAGE-MACHINE.TYPE (kirkstone, and every
    series with meta-mender, which empties IMAGE_NAME_SUFFIX), IMAGE-MACHINE.rootfs.TYPE
    (Yocto 4.3 and later without it)."""
    return [f"{image}-{yocto_machine}.{suffix}", f"{image}-{yocto_machine}.rootfs.{suffix}"]


def find_built(machine: str, options: FlashOptions, suffix: str, what: str, instead: str) -> Path:
    """The file of type `suffix` that `./task build --machine MACHINE [--role R]` made: in the
    --role's build (the provisioning role), else in whichever role's build has one. Two
    roles built and no --role: refused, naming both."""
    yocto_machine = MACHINES[machine].yocto_machine
    default_role = MACHINES[machine].default_role
    asked = options.provisioning.role
    roles = [asked] if asked else [default_role, *(role for role in build.ROLES if role != default_role)]
    found: list[tuple[str, Path]] = []
    looked: list[Path] = []
    for role in roles:
        directory = build.built_deploy_dir(machine, role, options.build_dir)
        if directory in {path.parent for path in looked}:
            continue  # --build-dir names one build whatever the role
        names = image_file_names(options.image, yocto_machine, suffix)
        looked.append(directory / names[0])
        hit = next((directory / name for name in names if (directory / name).is_file()), None)
        if hit is not None:
            found.append((role, hit))
    if len(found) == 2:
        raise FlashUsageError(
            f"{machine} has a server and an agent image ({found[0][1]}, {found[1][1]}): name the one to flash with "
            f"--role server or --role agent (with --server-url and --token-file for an agent), or pass {instead}"
        )
    if found:
        role, path = found[0]
        console.info(f"{what}: {path} (built as a k3s {role})")
        return path
    role_flag = f" --role {asked}" if asked and asked != default_role else ""
    other = f" (nor at {looked[1]})" if len(looked) > 1 else ""
    raise FlashError(
        f"no {what} at {looked[0]}{other}; build it first with `./task build --machine {machine}{role_flag}"
        f"{'' if options.image == MACHINES[machine].default_image else f' --target {options.image}'}` "
        f"(or pass {instead})"
    )


def checked_package(options: FlashOptions, machine: str, suffix: str, compression: str, elsewhere: str) -> Path:
    """The tegraflash package to flash (--package, else the build's `.suffix`), checked to be
    `compression` before anything else reads it; `elsewhere` says how another board's is flashed."""
    if options.package is not None:
        if not options.package.is_file():
            raise FlashError(f"--package {options.package} does not exist")
        found = options.package
    else:
        found = find_built(machine, options, suffix, "tegraflash package", "--package PATH")
    try:
        package_checks.check_compression(
            found, compression, f"pass the .{suffix} that ./task build --machine {machine} made ({elsewhere})")
    except package_checks.PackageError as wrong:
        raise FlashError(str(wrong)) from None
    return found


def tegraflash_package(options: FlashOptions, machine: str = NANO_MACHINE) -> Path:
    return checked_package(options, machine, "tegraflash.tar.gz", "gzip",
                           "an Orin's or Thor's package is flashed with its own --machine")


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
    options: FlashOptions, image_size: int, larger: str = blockdev.LARGER
) -> tuple[blockdev.BlockDevice, list[blockdev.Refusal]]:
    """Read the device named by --device, show it, and list what speaks against writing it."""
    assert options.device is not None
    try:
        name = blockdev.disk_name(options.device, options.root)
        forced = blockdev.disk_name(options.force_device, options.root) if options.force_device else None
    except blockdev.NotADisk as wrong:
        raise FlashUsageError(str(wrong)) from None
    try:
        device = blockdev.read_block_device(name, options.root)
    except FileNotFoundError as missing:
        raise FlashError(f"{missing}; list disks with `{blockdev.LIST_DISKS}`") from None
    if forced is not None and forced != name:
        raise FlashUsageError(
            f"--force-device {options.force_device} does not name the target --device {options.device}; "
            "name the same device in both"
        )
    host = blockdev.read_host_state(options.root)
    console.step("target device")
    for line in blockdev.describe(device, host, console.human_size):
        console.info(line)
    refusals = blockdev.refusals_for(device, image_size, host, larger)
    for refusal in refusals:
        console.info(f"- {refusal.reason}")
    return device, refusals


def check_device_argument(options: FlashOptions) -> None:
    """--device and --force-device name whole disks: a usage error before anything else."""
    try:
        for given in (options.device, options.force_device):
            if given:
                blockdev.disk_name(given, options.root)
    except blockdev.NotADisk as wrong:
        raise FlashUsageError(str(wrong)) from None


def _forced(options: FlashOptions, device: blockdev.BlockDevice) -> str | None:
    """--force-device, once inspect_target checked it names this device (maybe by a link)."""
    return device.path if options.force_device is not None else None


def refuse_unsafe_target(options: FlashOptions, image_size: int) -> blockdev.BlockDevice:
    """Early check before slow work: refusals that no typed confirmation could lift."""
    device, refusals = inspect_target(options, image_size)
    try:
        blockdev.decide(device, refusals, _forced(options, device), confirmed_by_typing=True)
    except blockdev.UnsafeTarget as unsafe:
        raise FlashError(str(unsafe)) from None
    return device


def check_target_device(
    options: FlashOptions,
    image_size: int,
    interactive: bool,
    read: Callable[[str], str] | None = None,
    larger: str = blockdev.LARGER,
) -> blockdev.BlockDevice:
    """Show the device, apply the safety policy, get confirmation. Raises FlashError. `larger`
    says what to do when the device is too small (the size it takes)."""
    device, refusals = inspect_target(options, image_size, larger)
    forced = options.force_device is not None
    # Unforced writes are confirmed by typing the path; --yes stands in for that only
    # when nothing at all speaks against the device.
    wants_typing = not forced and (bool(refusals) or not options.yes)
    typed = False
    if wants_typing and interactive and not options.dry_run:
        try:
            blockdev.decide(device, refusals, _forced(options, device), confirmed_by_typing=True)
        except blockdev.UnsafeTarget as unsafe:
            raise FlashError(str(unsafe)) from None
        typed = ask_typed_confirmation(device, read)
        if not typed:
            raise FlashError(f"not confirmed; nothing was written to {device.path}")
    try:
        blockdev.decide(device, refusals, _forced(options, device), typed)
    except blockdev.UnsafeTarget as unsafe:
        raise FlashError(str(unsafe)) from None
    if wants_typing and not typed and (not options.dry_run or not interactive):
        # --yes confirms only a device nothing speaks against (here: one that is not removable).
        instead = f"name it with --force-device {device.path}" if refusals else "pass --yes"
        stop_or_warn(options, f"writing {device.path} needs confirmation: run interactively and type the device "
                     f"path, or {instead}")
    return device


def require_bmaptool(options: FlashOptions, what: str) -> None:
    require_host_tools(options, [hosttools.BMAPTOOL], f"writing {what}")


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


def unpack_with(argv: list[str], package: Path, dry_run: bool) -> None:
    """tar, not a GUI tool or Python's tarfile: the package relies on tar keeping modes and links."""
    console.step(f"unpacking {package.name}")
    try:
        process.run(process.Command(argv), dry_run=dry_run)
    except process.CommandFailed as failure:
        raise FlashError(f"tar could not unpack {package} (exit code {failure.returncode}, its message above): "
                         "a damaged or incomplete package; build it again (or copy it again)") from None


def unpack(package: Path, workdir: Path, dry_run: bool) -> None:
    unpack_with(["tar", "-xzf", str(package), "-C", str(workdir)], package, dry_run)


def find_board(options: FlashOptions, target: usb.RecoveryTarget) -> usb.RecoveryBoard | None:
    """The one board of target in recovery mode; None on a --dry-run that finds none."""
    console.step(f"looking for a {target.name} in USB recovery mode")
    try:
        board = usb.select_recovery_board(usb.find_recovery_boards(options.root), target)
    except usb.NotOneBoardInRecovery as missing:
        stop_or_warn(options, str(missing))
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


def write_image_file(options: FlashOptions, image: Path, euid: int, interactive: bool, token: str,
                     what: str = "SD card") -> list[str]:
    """--sd-image (and an x86-64 node's disk image): bmaptool to --device, then the
    provisioning onto the written data partition."""
    if options.sd_image is not None and options.method:
        raise FlashUsageError(f"--method {options.method} and --sd-image exclude each other: --sd-image writes the "
                              "image file as it is, with bmaptool; leave --method out (or --sd-image, to flash the "
                              "build's package with that method)")
    if not options.device:
        raise FlashUsageError(f"--sd-image needs --device /dev/sdX (the {what} to write)")
    check_device_argument(options)
    if not image.is_file():
        raise FlashError(f"{image} does not exist: give --sd-image an image file that ./task build (or "
                         "--method sdcard without --device) made")
    require_bmaptool(options, f"{image.name} to {options.device}")
    _check_provisioning_role(options, provision.manifest_beside(image))
    written = write_sd_image(options, image, euid, interactive)
    results = [f"{'would write' if options.dry_run else 'wrote'} {image} to /dev/{written.name}"]
    return results + _provision_device(options, image, written, token, euid)


def run_flash(
    options: FlashOptions, euid: int | None = None, interactive: bool | None = None, machine: str = NANO_MACHINE
) -> list[str]:
    """Run the chosen method; returns summary lines. Raises FlashError, writing nothing
    to a device that fails the safety checks."""
    euid = os.geteuid() if euid is None else euid
    interactive = sys.stdin.isatty() if interactive is None else interactive
    results: list[str] = []
    token = provisioning_token(options)
    if options.sd_image is not None:
        return write_image_file(options, options.sd_image, euid, interactive, token)
    options = with_method(options)
    if options.method not in METHODS:
        raise FlashUsageError(f"unknown --method {options.method!r}; choose one of: {', '.join(METHODS)}")
    refuse_provisioning_nowhere(options)
    check_device_argument(options)
    package = tegraflash_package(options, machine)
    _check_provisioning_role(options, provision.manifest_beside(package), machine)
    if options.method == "sdcard" and options.device:
        # Refuse an unsafe device now, before minutes of dosdcard.sh; size is checked later.
        refuse_unsafe_target(options, image_size=0)
        require_bmaptool(options, f"the SD image to {options.device}")
    over_usb = options.method in ("full", "spi-only")
    board = find_board(options, usb.NANO) if over_usb else None
    with tempfile.TemporaryDirectory(prefix="gpu-k8s-flash-") as temp:
        workdir = Path(temp)
        unpack(package, workdir, options.dry_run)
        if over_usb and options.provisioning.wanted:
            results.append(provision_package(options, package, workdir, token, machine))
        if over_usb:
            results.append(flash_over_usb(options, board, workdir, euid))
        else:
            sd_image = make_sd_image(options, workdir)
            if options.device:
                written = write_sd_image(options, sd_image, euid, interactive)
                results.append(f"{'would write' if options.dry_run else 'wrote'} the SD image to {options.device}")
                # Onto the card, not into the SD image: that one is kept on this host.
                results += _provision_device(options, sd_image, written, token, euid)
            kept = options.output or package.parent / f"{options.image}-{NANO.yocto_machine}.sdcard"
            if options.dry_run:
                console.info(f"would keep the SD image as {kept}")
            else:
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(sd_image), kept)
                results.append(f"SD image: {kept} ({console.human_size(kept.stat().st_size)})")
    return results


# ---------------------------------------------------------------- provisioning (tools/flash/provision.py)


def provisioning_token(options: FlashOptions) -> str:
    """Every provisioning option checked before anything is unpacked or written."""
    if not options.provisioning.wanted:
        return ""
    try:
        token = provision.validate(options.provisioning)
    except provision.ProvisionUsageError as error:
        raise FlashUsageError(str(error)) from None
    except provision.ProvisionError as error:
        raise FlashError(str(error)) from None
    require_host_tools(options, [hosttools.DEBUGFS], "writing the provisioning onto the data partition")
    return token


def refuse_provisioning_nowhere(options: FlashOptions) -> None:
    """Methods that write no data partition take no provisioning: it would land nowhere, or
    in an SD image kept on this host."""
    if not options.provisioning.wanted:
        return
    if options.method == "spi-only":
        raise FlashUsageError("--method spi-only writes the boot firmware only: provisioning goes with a method "
                              "that writes the data partition (full, external-only, or sdcard/external --device)")
    if options.method == "sdcard" and not options.device:
        raise FlashUsageError("provisioning is written onto the card, never into a kept SD image: give "
                              "--device /dev/sdX")


def _check_provisioning_role(options: FlashOptions, manifest: Path | None, machine: str = NANO_MACHINE) -> None:
    try:
        provision.check_role(options.provisioning, manifest, machine)
    except provision.ProvisionError as error:
        raise FlashError(str(error)) from None


def provision_package(options: FlashOptions, package: Path, workdir: Path, token: str, machine: str) -> str:
    """Before anything is flashed: into the unpacked package's data image (a dry run reads
    only the few members that takes)."""
    console.step("writing the node's provisioning into the package's data partition image")
    asked = options.provisioning.role
    role = f" --role {asked}" if asked and asked != MACHINES[machine].default_role else ""
    rebuild = (f"rebuild it (./task build --machine {machine}{role}) and flash the board with the new package: "
               "provisioning lives on the data partition, which a board gets from a full flash of such a package")
    try:
        if options.dry_run:
            with tempfile.TemporaryDirectory(prefix="gpu-k8s-flash-check-") as peek:
                provision.peek_package(package, Path(peek))
                return provision.into_unpacked_package(Path(peek), options.provisioning, token, True, rebuild)
        return provision.into_unpacked_package(workdir, options.provisioning, token, False, rebuild)
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
