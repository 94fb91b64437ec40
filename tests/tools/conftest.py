"""Shared fixtures: stand-ins for external programs, first on PATH, that record their
arguments and play back realistic output; helpers to build fixture sysfs trees."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@dataclass
class StandIns:
    """A bin directory first on PATH; each stand-in logs one JSON line per call."""

    bin_dir: Path
    calls_dir: Path

    def add(self, name: str, body: str = "", exit_code: int = 0) -> Path:
        """body is Python run after the call is recorded; it sees argv, env and state_dir."""
        script = self.bin_dir / name
        script.write_text(
            f"#!{sys.executable}\n"
            "import json, os, sys\n"
            "argv = sys.argv[1:]\n"
            "env = os.environ\n"
            f"state_dir = {str(self.calls_dir)!r}\n"
            f"with open(os.path.join(state_dir, {name + '.calls'!r}), 'a') as log:\n"
            "    log.write(json.dumps({'argv': argv, 'cwd': os.getcwd()}) + '\\n')\n"
            + textwrap.dedent(body)
            + f"\nsys.exit({exit_code})\n"
        )
        script.chmod(0o755)
        return script

    def calls(self, name: str) -> list[dict]:
        log = self.calls_dir / f"{name}.calls"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
def stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StandIns:
    bin_dir = tmp_path / "stand-in-bin"
    calls_dir = tmp_path / "stand-in-calls"
    bin_dir.mkdir()
    calls_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return StandIns(bin_dir, calls_dir)


@pytest.fixture
def kept_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where tempfile puts directories during the test: flash keeps initrd-flash's logs in a
    directory of their own (tempfile.mkdtemp), which would otherwise outlive the test in /tmp."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def write_tree(root: Path, files: dict[str, str]) -> None:
    """Create files (relative path -> content) under root."""
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


# --- fixture host trees: /sys, /proc/self/mountinfo, /proc/swaps and /dev under a root ---

GB = 1000**3
USB_PATH = "devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block"
SATA_PATH = "devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block"
NVME_PATH = "devices/pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0"
MMC_PATH = "devices/pci0000:00/0000:00:1c.0/mmc_host/mmc0/mmc0:aaaa/block"


@dataclass
class HostTree:
    root: Path

    def add_disk(
        self,
        name: str,
        *,
        dev: str,
        size_bytes: int,
        removable: bool,
        bus_path: str,
        model: str,
        partitions: tuple[tuple[str, str, int], ...] = (),
        mmc_type: str | None = None,
    ) -> None:
        real = self.root / "sys" / bus_path / name
        files = {
            "dev": dev,
            "size": str(size_bytes // 512),
            "removable": "1" if removable else "0",
            "ro": "0",
            "device/model": model,
        }
        if mmc_type:
            files["device/type"] = mmc_type
            files["device/name"] = model
            del files["device/model"]
        for part_name, part_dev, part_size in partitions:
            files[f"{part_name}/partition"] = "1"
            files[f"{part_name}/dev"] = part_dev
            files[f"{part_name}/size"] = str(part_size // 512)
        write_tree(real, files)
        (real / "holders").mkdir(exist_ok=True)
        link = self.root / "sys" / "block" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(real, link.parent))
        device_file = self.root / "dev" / name
        device_file.parent.mkdir(parents=True, exist_ok=True)
        device_file.write_bytes(b"ORIGINAL CONTENT OF " + name.encode())

    def mount(self, dev: str, mount_point: str, source: str, fstype: str = "ext4") -> None:
        mountinfo = self.root / "proc" / "self" / "mountinfo"
        mountinfo.parent.mkdir(parents=True, exist_ok=True)
        number = len(mountinfo.read_text().splitlines()) + 20 if mountinfo.exists() else 20
        with mountinfo.open("a") as out:
            out.write(f"{number} 1 {dev} / {mount_point} rw,relatime shared:1 - {fstype} {source} rw\n")

    def add_usb_device(self, port: str, vendor: str, product: str, serial: str | None = None) -> None:
        files = {"idVendor": vendor, "idProduct": product, "busnum": port.split("-")[0], "devnum": "7"}
        if serial:
            files["serial"] = serial
        write_tree(self.root / "sys" / "bus" / "usb" / "devices" / port, files)


@pytest.fixture
def host_tree(tmp_path: Path) -> HostTree:
    """A workstation: SATA system disk, NVMe data disk, an SD slot, eMMC, and USB media."""
    tree = HostTree(tmp_path / "host")
    tree.add_disk(
        "sda",
        dev="8:0",
        size_bytes=500 * GB,
        removable=False,
        bus_path=SATA_PATH,
        model="ATA Samsung SSD 870",
        partitions=(("sda1", "8:1", GB // 2), ("sda2", "8:2", 499 * GB)),
    )
    tree.mount("0:26", "/proc", "proc", "proc")
    tree.mount("8:2", "/", "/dev/sda2")
    tree.mount("8:1", "/boot/efi", "/dev/sda1", "vfat")
    tree.add_disk(
        "nvme0n1",
        dev="259:0",
        size_bytes=1000 * GB,
        removable=False,
        bus_path=NVME_PATH,
        model="Samsung SSD 980 PRO",
        partitions=(("nvme0n1p1", "259:1", 1000 * GB),),
    )
    tree.add_disk(
        "sdb",
        dev="8:16",
        size_bytes=32 * GB,
        removable=True,
        bus_path=USB_PATH.replace("6:0", "7:0"),
        model="Generic STORAGE DEVICE",
        partitions=(("sdb1", "8:17", 32 * GB),),
    )
    tree.add_disk(
        "sdc",
        dev="8:32",
        size_bytes=16 * GB,
        removable=True,
        bus_path=USB_PATH.replace("6:0", "8:0"),
        model="SanDisk Cruzer",
        partitions=(("sdc1", "8:33", 16 * GB),),
    )
    tree.mount("8:33", "/media/user/CARD", "/dev/sdc1", "vfat")
    tree.add_disk(
        "sdd",
        dev="8:48",
        size_bytes=1 * GB,
        removable=True,
        bus_path=USB_PATH.replace("6:0", "9:0"),
        model="Tiny Card",
    )
    tree.add_disk(
        "sde",
        dev="8:64",
        size_bytes=64 * GB,
        removable=False,
        bus_path=USB_PATH.replace("6:0", "10:0"),
        model="Samsung Flash Drive FIT",
    )
    tree.add_disk(
        "mmcblk0",
        dev="179:0",
        size_bytes=32 * GB,
        removable=False,
        bus_path=MMC_PATH,
        model="SD32G",
        mmc_type="SD",
    )
    tree.add_disk(
        "mmcblk1",
        dev="179:32",
        size_bytes=32 * GB,
        removable=False,
        bus_path=MMC_PATH + "1",
        model="eMMC 32G",
        mmc_type="MMC",
    )
    return tree
