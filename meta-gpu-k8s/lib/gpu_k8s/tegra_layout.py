"""The Jetson data partition in an L4T flash layout (pure: layout text in, layout text out).

NVIDIA's Orin layouts put their only user partition, UDA (400 MiB, "reserved by NV for OTA"),
before the two rootfs slots, so it can never grow. The A/B images need a data partition that
holds docker's images and k3s's state from the first flash: this module appends one right after
APP_b, marked fill-to-end, carrying the Mender data image (the layout token DATAFILE), and takes
DATAFILE off any other partition (meta-mender-tegra-common's older bbappend puts it on UDA).

Used by classes/gpu_k8s_mender_tegra_layout.bbclass on the layouts tegra-storage-layout-base
stages; kept free of bitbake so the tests can call it. Partition numbers follow the rules of
meta-tegra's nvflashxmlparse.py, which turns the layout into the GPT: per device, an explicit
id wins, otherwise one past the previous partition; partition-table entries take no number; on
boot devices (QSPI "spi", "sdmmc_boot", the first "sdmmc") ids are ignored."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

DATAFILE = "DATAFILE"
_DATAFILE_ELEMENT = r"<filename>\s*" + DATAFILE + r"\s*</filename>"
# nvflashxmlparse's partition-table types: they carry no partition number
_TABLE_TYPES = {"GP1", "protective_master_boot_record", "primary_gpt", "GPT", "secondary_gpt"}
_BOOT_DEVICES = {"spi", "sdmmc_boot"}
# 0x800: fill to the end of the device; 0x8: what NVIDIA's user partitions carry beside it
FILL_TO_END = 0x808
_ALIGN = 16384  # bytes, as the APP slots


class LayoutError(ValueError):
    """The layout cannot carry the data partition; the message names the fix."""


@dataclass(frozen=True)
class Placement:
    text: str  # the layout with the data partition in place
    device: str  # the <device type> holding the rootfs slots and the data partition
    number: int  # the data partition's number on that device (/dev/<disk>p<number>)
    appended: bool  # False: the partition was already there (left as it was, DATAFILE added)


def partition_numbers(text: str) -> dict[str, dict[str, int]]:
    """{device type: {partition name: number}} as nvflashxmlparse numbers them."""
    root = ET.fromstring(text)
    numbers: dict[str, dict[str, int]] = {}
    for index, device in enumerate(root.findall("device")):
        kind = device.get("type", "")
        boot = kind in _BOOT_DEVICES or (kind == "sdmmc" and index == 0)
        found: dict[str, int] = {}
        following = 1
        for partition in device.findall("partition"):
            if partition.get("type") in _TABLE_TYPES:
                continue
            explicit = partition.get("id")
            number = following if boot or explicit is None else int(explicit)
            found[partition.get("name", "")] = number
            following = number + 1
        numbers[kind] = found
    return numbers


def _partition_span(text: str, name: str) -> list[re.Match]:
    pattern = r'[ \t]*<partition\s+name="' + re.escape(name) + r'"[^>]*>.*?</partition>[ \t]*\n?'
    return list(re.finditer(pattern, text, re.S))


def _without_datafile(text: str) -> str:
    return re.sub(r"[ \t]*" + _DATAFILE_ELEMENT + r"[ \t]*\n?", "", text)


def _block(name: str, number: int, size_bytes: int, indent: str) -> str:
    inner = indent + "    "
    lines = [
        f'{indent}<partition name="{name}" id="{number}" type="data">',
        f"{inner}<allocation_policy> sequential </allocation_policy>",
        f"{inner}<filesystem_type> basic </filesystem_type>",
        f"{inner}<size> {size_bytes} </size>",
        f"{inner}<file_system_attribute> 0 </file_system_attribute>",
        f"{inner}<allocation_attribute> 0x{FILL_TO_END:x} </allocation_attribute>",
        f"{inner}<align_boundary> {_ALIGN} </align_boundary>",
        f"{inner}<percent_reserved> 0 </percent_reserved>",
        f"{inner}<filename> {DATAFILE} </filename>",
        f"{inner}<description> meta-gpu-k8s: /data, node state kept across A/B updates; fills the rest of",
        f"{inner}  the device (the Mender data image, grown at first boot). </description>",
        f"{indent}</partition>",
    ]
    return "\n".join(lines) + "\n"


def place_data_partition(text: str, name: str, size_bytes: int) -> Placement | None:
    """The layout with the data partition `name` after APP_b; None when the layout has no
    rootfs slots (a QSPI-only boot layout). An existing `name` is kept where it is, provided it
    follows APP_b on the same device and fills to the end; DATAFILE ends up on it alone."""
    if size_bytes <= 0:
        raise LayoutError(f"the data partition's size must be positive, got {size_bytes} bytes")
    slots = _partition_span(text, "APP_b")
    if not slots:
        return None
    if len(slots) > 1:
        raise LayoutError("the layout has APP_b on more than one device: name the device the rootfs boots from "
                          "in PARTITION_LAYOUT_TEMPLATE/PARTITION_LAYOUT_EXTERNAL")
    numbers = partition_numbers(text)
    device = next(kind for kind, parts in numbers.items() if "APP_b" in parts)
    existing = _partition_span(text, name)
    if existing:
        return _adopt(text, name, device, numbers, existing[0])
    number = max(numbers[device].values()) + 1
    indent = re.match(r"[ \t]*", slots[0].group(0)).group(0)
    cleaned = _without_datafile(text)
    anchor = _partition_span(cleaned, "APP_b")[0]
    placed = cleaned[:anchor.end()] + _block(name, number, size_bytes, indent) + cleaned[anchor.end():]
    return Placement(placed, device, partition_numbers(placed)[device][name], appended=True)


def _adopt(text: str, name: str, device: str, numbers: dict[str, dict[str, int]], span: re.Match) -> Placement:
    """A data partition someone else appended already (meta-mender-tegra's newer layouts do)."""
    if name not in numbers[device]:
        raise LayoutError(f'partition "{name}" is not on the device that holds the rootfs slots ({device})')
    element = ET.fromstring(span.group(0).strip())
    attribute = element.findtext("allocation_attribute", "0").strip()
    if not int(attribute, 16) & 0x800:
        raise LayoutError(f'partition "{name}" does not fill to the end of the device '
                          f"(allocation_attribute {attribute}): /data could never grow")
    if span.start() < _partition_span(text, "APP_b")[0].start():
        raise LayoutError(f'partition "{name}" comes before the rootfs slots: /data could never grow')
    partition = span.group(0)
    cleaned = _without_datafile(text[:span.start()]) + partition + _without_datafile(text[span.end():])
    if not re.search(_DATAFILE_ELEMENT, partition):
        indent = re.match(r"[ \t]*", partition).group(0) + "    "
        with_file = re.sub(r"([ \t]*)</partition>", f"{indent}<filename> {DATAFILE} </filename>\n\\1</partition>",
                           partition, count=1)
        cleaned = cleaned.replace(partition, with_file, 1)
    return Placement(cleaned, device, numbers[device][name], appended=False)


def datafile_partitions(text: str) -> list[str]:
    """Names of the partitions that carry the data image (exactly one when placed)."""
    root = ET.fromstring(text)
    return [p.get("name", "") for p in root.iter("partition") if (p.findtext("filename") or "").strip() == DATAFILE]
