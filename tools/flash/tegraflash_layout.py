"""Which file of a tegraflash package becomes the board's data partition.

meta-tegra's package carries the partition layouts the flash writes (`flash.xml.in`: the
boot device, and the SD card or eMMC where the rootfs lives there; `external-flash.xml.in`:
the NVMe drive or other external rootfs device). A partition whose `<filename>` is the token
`DATAFILE` is the data partition: the flash helper replaces the token with its `--datafile`
argument, which the package's scripts take from `DATAFILE` in `.env.initrd-flash`
(initrd-flash) or have written in (`doflash.sh`, `dosdcard.sh`: `--datafile NAME`). With no
such file the helper drops the partition's content. meta-mender's data image is an ext4 file
system labelled `data` (MENDER_DATA_PART_LABEL); provisioning goes into it before flashing.

Parsing is pure; the only I/O reads the unpacked package's small text files."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

# The layouts a flash writes, in the order meta-tegra's scripts use them (rcmboot-flash.xml.in
# only boots the board over USB and writes nothing).
LAYOUTS = ("flash.xml.in", "external-flash.xml.in")
ENV_FILE = ".env.initrd-flash"
SCRIPTS = ("doflash.sh", "dosdcard.sh", "doexternal.sh")
DATA_TOKEN = "DATAFILE"

_ASSIGNMENT = re.compile(r'^(?P<name>[A-Z_][A-Z0-9_]*)="(?P<value>[^"]*)"\s*$', re.M)
_DATAFILE_ARG = re.compile(r"--datafile\s+(?P<name>[^\s\"']+)")


class LayoutError(Exception):
    """The package names no data partition image; the message says what the package has."""


@dataclass(frozen=True)
class DataPartition:
    layout: str  # the layout file naming it
    partition: str  # its name in the layout (UDA, permanent_user_storage, ...)
    image: str  # the file in the package that the flash writes to it ('' when none)


def partitions_with_token(layout_text: str, token: str = DATA_TOKEN) -> list[str]:
    """Names of the partitions whose <filename> is `token`."""
    try:
        root = ElementTree.fromstring(layout_text)
    except ElementTree.ParseError as error:
        raise LayoutError(f"unreadable partition layout ({error})") from None
    return [partition.get("name", "?") for partition in root.iter("partition")
            if (partition.findtext("filename") or "").strip() == token]


def data_file_name(env_text: str, script_texts: list[str]) -> str:
    """What DATAFILE stands for: .env.initrd-flash's DATAFILE, else a script's --datafile;
    '' when the package was built without a data image."""
    values = {match["name"]: match["value"] for match in _ASSIGNMENT.finditer(env_text)}
    if DATA_TOKEN in values:
        return values[DATA_TOKEN].strip()
    for text in script_texts:
        match = _DATAFILE_ARG.search(text)
        if match:
            return match["name"]
    return ""


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""


def data_partitions(package_dir: Path) -> list[DataPartition]:
    """Every partition of the package's layouts that gets the data image. Raises LayoutError
    when the directory holds no layout (not a meta-tegra package)."""
    present = [name for name in LAYOUTS if (package_dir / name).is_file()]
    if not present:
        raise LayoutError(f"no partition layout ({' or '.join(LAYOUTS)}) in it: not a tegraflash package "
                          "meta-tegra made")
    image = data_file_name(_read(package_dir / ENV_FILE), [_read(package_dir / name) for name in SCRIPTS])
    return [DataPartition(layout, partition, image)
            for layout in present for partition in partitions_with_token(_read(package_dir / layout))]


def small_members(name: str) -> bool:
    """The package members data_partitions reads (to pick them out of a package unread)."""
    return name in LAYOUTS or name == ENV_FILE or name in SCRIPTS
