"""Is this the tegraflash package the flash path expects? Told before anything is written to a
board or a disk: the file's compression by its first bytes (the Nano's .tegraflash.tar.gz is
gzip, the Orin's and Thor's .tegraflash-tar.zst zstd), and, once it is open, the chip and the
MACHINE it was made for (meta-tegra's image_types_tegra.bbclass writes CHIPID and MACHINE into
.env.initrd-flash, which initrd-flash reads). A dry run reads only the few small members these
checks and the size check need (`peek`), not the gigabytes."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from tools.flash import tegraflash_layout

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
TAR_MAGIC = (257, b"ustar")
FORMATS = {
    "gzip": "a gzip tar (the Jetson Nano's .tegraflash.tar.gz)",
    "zstd": "a zstd tar (the Orin's and Thor's .tegraflash-tar.zst)",
    "tar": "an uncompressed tar",
    None: "not a tar archive of any kind this flash reads",
}
ENV_FILE = tegraflash_layout.ENV_FILE


class PackageError(Exception):
    """The package is not one this path flashes; the message names what it is and the fix."""


def compression(path: Path) -> str | None:
    """'zstd', 'gzip', 'tar', or None, from the file's first bytes."""
    with path.open("rb") as handle:
        head = handle.read(TAR_MAGIC[0] + len(TAR_MAGIC[1]))
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    return "tar" if head[TAR_MAGIC[0]:] == TAR_MAGIC[1] else None


def check_compression(path: Path, wanted: str, fix: str) -> None:
    found = compression(path)
    if found != wanted:
        raise PackageError(f"{path} is {FORMATS[found]}, not {FORMATS[wanted]}: {fix}")


def env_values(text: str) -> dict[str, str]:
    """KEY=value and KEY="value" lines of .env.initrd-flash (shell syntax; nothing is run)."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.isidentifier():
            values[key] = value.strip().strip('"')
    return values


def check_made_for(package_dir: Path, chip_id: str, yocto_machine: str, fix: Callable[[str], str]) -> None:
    """The package's CHIPID and MACHINE are the target's; `fix(machine)` says what to do with a
    package made for another MACHINE. A package without .env.initrd-flash is not judged here
    (initrd-flash itself refuses it)."""
    env = package_dir / ENV_FILE
    if not env.is_file():
        return
    values = env_values(env.read_text(errors="replace"))
    made_for = values.get("MACHINE", "")
    if values.get("CHIPID", chip_id) != chip_id:
        raise PackageError(f"this package was made for CHIPID {values['CHIPID']} (MACHINE {made_for or '?'}), "
                           f"not {chip_id} ({yocto_machine}), says its {ENV_FILE}: {fix(made_for)}")
    if made_for and made_for != yocto_machine:
        raise PackageError(f"this package was made for MACHINE {made_for}, not {yocto_machine}, says its "
                           f"{ENV_FILE}: {fix(made_for)}")


def rootfs_storage(package_dir: Path) -> str | None:
    """Where the package writes the rootfs: "nvme" (EXTERNAL_ROOTFS_DRIVE=1: external-flash.xml.in,
    which meta-tegra writes when TNSPEC_BOOTDEV is not the default mmcblk0p1), else the type of the
    rootfs device in flash.xml.in: "sdcard", or "emmc" (sdmmc_user, an "sdmmc" after the boot
    device); None when the package does not say."""
    env = package_dir / ENV_FILE
    values = env_values(env.read_text(errors="replace")) if env.is_file() else {}
    if values.get("EXTERNAL_ROOTFS_DRIVE") == "1":
        return "nvme"
    layout = package_dir / "flash.xml.in"
    if values.get("EXTERNAL_ROOTFS_DRIVE") != "0" or not layout.is_file():
        return None
    kinds = re.findall(r'<device\s+type="([^"]+)"', layout.read_text(errors="replace"))
    rootfs = [kind for kind in kinds[1:] if kind not in ("spi", "sdmmc_boot")]
    if rootfs == ["sdcard"]:
        return "sdcard"
    return "emmc" if rootfs in (["sdmmc"], ["sdmmc_user"]) else None


def _tar(package: Path, args: Sequence[str]) -> str:
    flags = {"zstd": ["--zstd"], "gzip": ["-z"]}.get(compression(package) or "", [])
    completed = subprocess.run(["tar", *flags, *args], capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        lines = [line for line in completed.stderr.splitlines() if line.strip()]
        raise PackageError(f"cannot read {package}: {lines[-1] if lines else 'tar failed'}")
    return completed.stdout


def peek(package: Path, into: Path) -> None:
    """For a dry run: the package's layouts, .env.initrd-flash and scripts, into `into`."""
    names = _tar(package, ["-tf", str(package)]).splitlines()
    small = [name for name in names if tegraflash_layout.small_members(Path(name).name)]
    if small:
        _tar(package, ["-xf", str(package), "-C", str(into), "--", *small])
