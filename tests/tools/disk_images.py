"""Small real disk and file-system images for the provisioning tests: ext4 made by mkfs.ext4,
a GPT disk laid out as meta-mender's A/B images are (boot, root slot, data last), read back with
the real debugfs. Made in each test; no image is committed."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

MIB = 1024 * 1024
DATA_AT = 4 * MIB  # where gpt_disk puts the 'data' file system

HAVE_E2FSPROGS = bool(shutil.which("debugfs") and shutil.which("mkfs.ext4"))


def ext4(path: Path, label: str, size: int = 8 * MIB) -> Path:
    with path.open("wb") as out:
        out.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", label, str(path)], check=True, capture_output=True)
    return path


def gpt_disk(path: Path, scratch: Path) -> Path:
    """A Mender-like disk: a boot partition, a root slot, and the 'data' ext4 at DATA_AT."""
    entries = bytearray(128 * 128)
    for index, (first, last) in enumerate(((2048, 4095), (4096 + 0, 4096 + 2047), (DATA_AT // 512, 24575))):
        struct.pack_into("<16s16sQQ", entries, index * 128, b"\x01" * 16, bytes([index + 1]) * 16, first, last)
    header = bytearray(512)
    struct.pack_into("<8sIIIIQQQQ16sQII", header, 0, b"EFI PART", 0x10000, 92, 0, 0, 1, 0, 34, 24575,
                     b"\x02" * 16, 2, 128, 128)
    with path.open("wb") as out:
        out.truncate(12 * MIB)
        out.seek(512)
        out.write(header)
        out.seek(1024)
        out.write(entries)
        out.seek(2048 * 512)
        out.write(ext4(scratch / "boot.img", "boot", 1 * MIB).read_bytes())
        out.seek(DATA_AT)
        out.write(ext4(scratch / "data.img", "data").read_bytes())
    return path


def read_back(target: str | Path, path: str) -> str:
    return subprocess.run(["debugfs", "-R", f"cat {path}", str(target)], capture_output=True, text=True,
                          check=True).stdout
