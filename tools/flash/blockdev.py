"""Block-device safety: decide whether writing an image to a disk could destroy data.

The facts come from sysfs, /proc/self/mountinfo and /proc/swaps under a root prefix (so
tests use fixture trees); the decision, `refusals_for`, is a pure function of them.

Policy (docs/tooling.md explains it to users):
- refused always, whatever the flags: holding the host's own system (/, /boot, /boot/efi,
  /efi, /usr, /var, /home), through a partition or anything stacked on it such as
  LVM/dm-crypt; mounted anywhere else (unmount it first: a write under a mounted file
  system is corrupted by it); used as swap; read-only; smaller than the image;
- refused unless confirmed (typing the device path) or named by `--force-device /dev/X`:
  not removable;
- "removable" means sysfs removable=1, or attached over USB (many USB card readers and
  sticks report removable=0), or an SD card in an MMC slot (type SD); internal SATA/NVMe
  disks and eMMC are not removable.
- interactive confirmation (typing the device path) is asked for every write to a device
  that passed these checks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

SECTOR_BYTES = 512  # sysfs "size" is always in 512-byte sectors
# Mount points that make a disk this host's own: never written, with or without flags.
SYSTEM_MOUNTS = ("/", "/boot", "/boot/efi", "/efi", "/usr", "/var", "/home")
LIST_DISKS = "lsblk -d -o NAME,SIZE,MODEL,TRAN,RM"
LARGER = "choose a larger device"


@dataclass(frozen=True)
class Partition:
    name: str
    dev_number: str  # "major:minor"
    size_bytes: int


@dataclass(frozen=True)
class BlockDevice:
    name: str  # "sdb", "mmcblk0"
    dev_number: str
    size_bytes: int
    removable_flag: bool
    read_only: bool
    usb_attached: bool
    mmc_type: str | None  # "SD" or "MMC" for mmcblk devices
    model: str
    partitions: tuple[Partition, ...] = ()
    holders: tuple[str, ...] = ()  # dev numbers of devices stacked on it (dm, md)

    @property
    def path(self) -> str:
        return f"/dev/{self.name}"

    @property
    def removable(self) -> bool:
        return self.removable_flag or self.usb_attached or self.mmc_type == "SD"


@dataclass(frozen=True)
class Mount:
    dev_number: str
    mount_point: str
    source: str


@dataclass(frozen=True)
class Refusal:
    reason: str
    overridable: bool = True  # --force-device lifts it (not removable only)
    by_confirmation: bool = False  # a typed confirmation is enough (not removable only)
    fix: str = ""  # for a refusal no flag lifts: what to do instead


@dataclass(frozen=True)
class HostBlockState:
    """What the host is using right now."""

    mounts: tuple[Mount, ...] = ()
    swap_devices: tuple[str, ...] = ()  # device paths from /proc/swaps
    dev_numbers_by_name: dict[str, str] = field(default_factory=dict)


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def _holders(directory: Path, root: Path) -> list[str]:
    """Dev numbers of everything stacked on a disk or partition, recursively."""
    found = []
    for holder in sorted((directory / "holders").glob("*")):
        holder_dir = root / "sys" / "block" / holder.name
        number = _read(holder_dir / "dev")
        if number:
            found.append(number)
        found.extend(_holders(holder_dir, root))
    return found


def read_block_device(name: str, root: Path = Path("/")) -> BlockDevice:
    """Facts about /dev/NAME from sysfs. Raises FileNotFoundError when there is no such disk."""
    directory = root / "sys" / "block" / name
    if not directory.exists():
        raise FileNotFoundError(f"/dev/{name} is not a whole disk known to the kernel (no {directory})")
    partitions = []
    holders = _holders(directory, root)
    for child in sorted(directory.iterdir()):
        if (child / "partition").exists():
            size = int(_read(child / "size", "0")) * SECTOR_BYTES
            partitions.append(Partition(child.name, _read(child / "dev"), size))
            holders.extend(_holders(child, root))
    # The resolved sysfs path of a USB disk runs through its USB host controller.
    resolved = os.path.realpath(directory)
    vendor_and_model = (_read(directory / "device" / "vendor"), _read(directory / "device" / "model"))
    model = " ".join(part for part in vendor_and_model if part) or _read(directory / "device" / "name")
    mmc_type = _read(directory / "device" / "type") or None if name.startswith("mmcblk") else None
    return BlockDevice(
        name=name,
        dev_number=_read(directory / "dev"),
        size_bytes=int(_read(directory / "size", "0")) * SECTOR_BYTES,
        removable_flag=_read(directory / "removable") == "1",
        read_only=_read(directory / "ro") == "1",
        usb_attached="/usb" in resolved,
        mmc_type=mmc_type,
        model=model or "unknown model",
        partitions=tuple(partitions),
        holders=tuple(holders),
    )


def _unescape_mountinfo(field_text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \040 style octal.
    return field_text.encode().decode("unicode_escape") if "\\" in field_text else field_text


def parse_mountinfo(text: str) -> tuple[Mount, ...]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields or len(fields) < 7:
            continue
        separator = fields.index("-")
        source = fields[separator + 2] if len(fields) > separator + 2 else ""
        mounts.append(Mount(fields[2], _unescape_mountinfo(fields[4]), source))
    return tuple(mounts)


def parse_swaps(text: str) -> tuple[str, ...]:
    return tuple(line.split()[0] for line in text.splitlines()[1:] if line.strip())


def read_host_state(root: Path = Path("/")) -> HostBlockState:
    return HostBlockState(
        mounts=parse_mountinfo(_read(root / "proc" / "self" / "mountinfo")),
        swap_devices=parse_swaps(_read(root / "proc" / "swaps")),
    )


def list_disks(root: Path = Path("/")) -> list[BlockDevice]:
    disks = []
    for entry in sorted((root / "sys" / "block").glob("*")):
        if entry.name.startswith(("loop", "ram", "zram", "dm-", "md", "sr")):
            continue
        disks.append(read_block_device(entry.name, root))
    return disks


def _device_numbers(device: BlockDevice) -> dict[str, str]:
    """dev number -> what it is (the disk, a partition or a stacked device)."""
    numbers = {device.dev_number: device.path}
    numbers.update({p.dev_number: f"/dev/{p.name}" for p in device.partitions})
    numbers.update({number: f"a device stacked on {device.path} ({number})" for number in device.holders})
    return numbers


def refusals_for(device: BlockDevice, image_size: int, host: HostBlockState, larger: str = LARGER) -> list[Refusal]:
    """Every reason writing an image of image_size bytes to device could destroy data; `larger`
    is the fix for a device too small (the caller knows what size it takes)."""
    refusals: list[Refusal] = []
    numbers = _device_numbers(device)
    names = {f"/dev/{p.name}" for p in device.partitions} | {device.path}
    for mount in host.mounts:
        if mount.dev_number not in numbers and mount.source not in names:
            continue
        what = numbers.get(mount.dev_number, mount.source)
        if mount.mount_point in SYSTEM_MOUNTS:
            refusals.append(Refusal(f"it holds {mount.mount_point} of this host ({what})", overridable=False,
                                    fix=f"this host's own disk is never written: choose another device ({LIST_DISKS})"))
        else:
            unmount = f"sudo umount {what}" if what.startswith("/dev/") else f"sudo umount {mount.mount_point}"
            refusals.append(Refusal(f"it is mounted: {what} on {mount.mount_point}", overridable=False,
                                    fix=f"unmount it first ({unmount}, or eject it in the file manager), then "
                                    "run again"))
    for swap in host.swap_devices:
        if swap in names:
            refusals.append(Refusal(f"it is in use as swap ({swap})", overridable=False,
                                    fix=f"sudo swapoff {swap} first, or choose another device"))
    if not device.removable:
        refusals.append(
            Refusal(
                "it is not removable (an internal disk, not a USB stick, USB card reader or SD card)",
                by_confirmation=True,
            )
        )
    if device.read_only:
        refusals.append(Refusal("it is read-only (the card's lock switch?)", overridable=False,
                                fix="slide the card's lock switch off, or choose another device"))
    if device.size_bytes < image_size:
        refusals.append(
            Refusal(
                f"it is smaller than the image ({device.size_bytes} < {image_size} bytes)",
                overridable=False,
                fix=larger,
            )
        )
    return refusals


def describe(device: BlockDevice, host: HostBlockState, human_size) -> list[str]:
    """Lines that let a person recognise the disk before it is overwritten."""
    kind = "USB" if device.usb_attached else ("SD card" if device.mmc_type == "SD" else "internal")
    lines = [f"{device.path}: {device.model}, {human_size(device.size_bytes)}, {kind}"
             + (", removable" if device.removable else ", not removable")]
    mounted_at = {m.dev_number: m.mount_point for m in host.mounts}
    for partition in device.partitions:
        where = mounted_at.get(partition.dev_number)
        suffix = f", mounted on {where}" if where else ""
        lines.append(f"  /dev/{partition.name}: {human_size(partition.size_bytes)}{suffix}")
    if not device.partitions:
        lines.append("  (no partitions)")
    return lines


def normalise_device_path(text: str) -> str:
    """'sdb', '/dev/sdb' -> 'sdb'; partitions are not accepted as targets."""
    return text.removeprefix("/dev/").strip("/")


class NotADisk(Exception):
    """--device names no whole disk: a file, a partition, a path outside /dev."""


def _partition_parent(name: str, root: Path) -> str | None:
    for disk in (root / "sys" / "block").glob("*"):
        if (disk / name / "partition").exists():
            return disk.name
    return None


def disk_name(text: str, root: Path = Path("/")) -> str:
    """The kernel's name of the whole disk a --device argument names: 'sdb', '/dev/sdb' and
    links to it (/dev/disk/by-id/...) give 'sdb'. Raises NotADisk for anything else, saying
    what it is by its real path."""
    text = text.strip()
    if "/" not in text:
        name = text
    elif text.startswith("/dev/"):
        real = Path(os.path.realpath(root / text.lstrip("/")))
        dev = Path(os.path.realpath(root / "dev"))
        if dev not in real.parents:
            raise NotADisk(f"--device {text} leads to {Path('/') / real.relative_to(root)}, which is not a disk; "
                           f"give the whole disk, e.g. /dev/sdb ({LIST_DISKS})")
        name = str(real.relative_to(dev))
    else:
        real = Path(os.path.realpath(text))
        what = ("a directory" if real.is_dir() else "a regular file" if real.is_file() else
                "not there" if not real.exists() else "not a block device")
        raise NotADisk(f"--device {text} is {what} ({real}), not a disk: give the whole disk, e.g. /dev/sdb "
                       f"({LIST_DISKS}); an image file is the thing written, --sd-image FILE")
    parent = _partition_parent(name, root)
    if parent is not None:
        raise NotADisk(f"--device /dev/{name} is a partition of /dev/{parent}: give the whole disk, /dev/{parent} "
                       "(the image carries its own partition table)")
    return name


class UnsafeTarget(Exception):
    pass


def decide(
    device: BlockDevice,
    refusals: Iterable[Refusal],
    force_device: str | None,
    confirmed_by_typing: bool,
) -> None:
    """Raise UnsafeTarget unless every refusal is overridden the way the policy allows."""
    refusals = list(refusals)
    forced = force_device is not None and normalise_device_path(force_device) == device.name
    blocking = []
    for refusal in refusals:
        if not refusal.overridable:
            blocking.append(refusal)
        elif forced or refusal.by_confirmation and confirmed_by_typing:
            continue
        else:
            blocking.append(refusal)
    if not blocking:
        return
    reasons = "; ".join(r.reason for r in blocking)
    fixed = [r.fix for r in blocking if not r.overridable]
    # No flag is offered where one refusal is final (the host's own disk above all).
    fix = "; ".join(dict.fromkeys(fixed)) if fixed else (
        f"type the device path when asked, or use --force-device {device.path} if it is the right disk")
    raise UnsafeTarget(f"refusing to write {device.path}: {reasons} ({fix})")
