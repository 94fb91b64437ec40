"""How much of a card (or drive) meta-tegra's make-sdcard needs for a flash layout: pure, layout
text in, bytes out. dosdcard.sh and doexternal.sh both end in make-sdcard, so this is what the
Orin's card or NVMe drive must hold, and what an SD image made with `-s SIZE` must fit in.

make-sdcard (meta-tegra wrynose 727633de, tegra-helper-scripts/make-sdcard.sh) asks
nvflashxmlparse for the partitions of the layout's rootfs device (`-t rootfs`: the device after
the boot device, or the only one when it is not a boot device) and creates every one of them
with sgdisk, in order, each at the next free sector sgdisk aligns to (no --honor-start-locations);
the partition marked fill-to-end (0x800 in allocation_attribute: the layer's data partition)
takes what is left, and needs at least its own size for the image written into it. nvflashxmlparse
rounds each size up to whole sectors and skips the partition-table entries."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

SECTOR_BYTES = 512
# sgdisk's default alignment on a fresh GPT: every partition starts on a 1 MiB boundary.
ALIGN_SECTORS = 2048
BACKUP_GPT_SECTORS = 33  # the backup header and its 32 sectors of entries, at the end
_BOOT_DEVICES = ("spi", "sdmmc_boot")
_PARTITION_TABLES = {"GP1", "protective_master_boot_record", "primary_gpt", "GPT", "secondary_gpt"}
_FILL_TO_END = 0x800
_UNITS = {"K": 1000, "M": 1000**2, "G": 1000**3}
# Card sizes sold, in GB: what a message names as the card to buy.
CARD_SIZES_GB = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class LayoutSizeError(ValueError):
    """The layout cannot be sized (no rootfs device, a size that is not a number)."""


@dataclass(frozen=True)
class Partition:
    name: str
    sectors: int
    fills: bool  # takes the rest of the device (at least `sectors`)


def card_sectors(size: str) -> int:
    """make-sdcard's `-s SIZE` for an image file, in sectors: 1000-based K/M/G, with 1 % kept
    back for the card the image goes onto; a bare number is sectors already."""
    unit = _UNITS.get(size[-1:])
    if unit is None:
        return int(size)
    return (int(size[:-1]) * unit * 99 // 100 + SECTOR_BYTES - 1) // SECTOR_BYTES


def _rootfs_device(root: ET.Element) -> ET.Element:
    devices = root.findall("device")
    kinds = [device.get("type", "") for device in devices]
    # nvflashxmlparse: an "sdmmc" first in the file is the eMMC's boot area, later its user area
    boot = [kind in _BOOT_DEVICES or (kind == "sdmmc" and index == 0) for index, kind in enumerate(kinds)]
    if not devices or len(devices) > 2:
        raise LayoutSizeError(f"the layout has {len(devices)} devices: make-sdcard takes one or two")
    if not boot[0]:
        return devices[0]
    if len(devices) == 2:
        return devices[1]
    raise LayoutSizeError(f"the layout has only its boot device ({kinds[0]}): nothing for make-sdcard to write")


def _sectors(partition: ET.Element, sector_bytes: int) -> int:
    text = (partition.findtext("size") or "0").strip()
    try:
        size = int(text, 0)
    except ValueError:
        raise LayoutSizeError(f"partition {partition.get('name')!r} has size {text!r}, not a number: a layout "
                              "from a tegraflash package has every size filled in") from None
    return (size + sector_bytes - 1) // sector_bytes


def rootfs_partitions(layout_text: str) -> list[Partition]:
    """The partitions make-sdcard creates, in order, with their sizes in 512-byte sectors."""
    try:
        root = ET.fromstring(layout_text)
    except ET.ParseError as error:
        raise LayoutSizeError(f"the layout is not XML: {error}") from None
    device = _rootfs_device(root)
    sector_bytes = int(device.get("sector_size", str(SECTOR_BYTES)), 0)
    found = []
    for partition in device.findall("partition"):
        if partition.get("type") in _PARTITION_TABLES:
            continue
        attribute = (partition.findtext("allocation_attribute") or "0").strip().removeprefix("0x")
        sectors = _sectors(partition, sector_bytes) * sector_bytes // SECTOR_BYTES
        found.append(Partition(partition.get("name", ""), sectors, bool(int(attribute or "0", 16) & _FILL_TO_END)))
    return found


def needed_sectors(partitions: list[Partition]) -> int:
    """The smallest device, in sectors, that sgdisk lays these partitions out on."""
    end = 0  # one past the last sector used so far (the primary GPT sits below the first start)
    for partition in partitions:
        start = -(-max(end, 1) // ALIGN_SECTORS) * ALIGN_SECTORS
        end = start + partition.sectors
    return end + BACKUP_GPT_SECTORS


def needed_bytes(layout_text: str) -> int:
    return needed_sectors(rootfs_partitions(layout_text)) * SECTOR_BYTES


def card_to_buy(needed: int) -> int:
    """The smallest card size sold, in GB, that holds `needed` bytes with make-sdcard's 1 % kept back."""
    for size in CARD_SIZES_GB:
        if card_sectors(f"{size}G") * SECTOR_BYTES >= needed:
            return size
    return CARD_SIZES_GB[-1]


def gigabytes(size_bytes: int) -> str:
    """1000-based, as card sizes are sold and as make-sdcard reads -s."""
    return f"{size_bytes / 1000**3:.2f} GB"
