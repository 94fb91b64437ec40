"""Find Jetson boards in USB recovery mode by reading sysfs (no lsusb needed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NVIDIA_VENDOR_ID = "0955"
NANO_RECOVERY_PRODUCT_ID = "7f21"
# Orin modules in recovery mode, by USB product id: meta-tegra wrynose's find-jetson-usb.sh
# accepts these, and NVIDIA's and carrier vendors' flashing guides name the module of each.
ORIN_RECOVERY_MODELS: dict[str, str] = {
    "7023": "Jetson AGX Orin (P3701-0000/-0005)",
    "7223": "Jetson AGX Orin 32GB (P3701-0004)",
    "7323": "Jetson Orin NX 16GB (P3767-0000)",
    "7423": "Jetson Orin NX 8GB (P3767-0001)",
    "7523": "Jetson Orin Nano 8GB (P3767-0003/-0005, the devkit's)",
    "7623": "Jetson Orin Nano 4GB (P3767-0004)",
}
# Thor modules in recovery mode, by USB product id (meta-tegra wrynose 727633de accepts both in
# find-jetson-usb.sh; on that branch both came with the R39.2 update, 4639b3bb): 7026 is "Jetson
# AGX Thor dev kit" in docs/Flashing-without-sudo.md and entered find-jetson-usb.sh with R38.2's
# t264 support (a8a2a166, branch master-l4t-r38.4.x), when the devkit's T5000 was the only module;
# 7226 entered it in the commit that added the jetson-agx-thor-t4000 machine and its chip SKU E2
# (9fa7f103, by NVIDIA, on master-l4t-r38.4.x). 7326 (P3834-0001, named in the same doc) is no
# meta-tegra machine and find-jetson-usb.sh does not accept it.
THOR_RECOVERY_MODELS: dict[str, str] = {
    "7026": "Jetson AGX Thor T5000 (P3834-0008, the devkit's)",
    "7226": "Jetson AGX Thor T4000 (P3834-0000)",
}
RECOVERY_MODELS: dict[str, str] = {**ORIN_RECOVERY_MODELS, **THOR_RECOVERY_MODELS}
# Recovery-mode product ids of the other Jetson modules (meta-tegra's find-jetson-usb.sh and the
# ids of its kirkstone branch).
OTHER_JETSON_RECOVERY_PRODUCT_IDS = frozenset(
    {"7018", "7418", "7c18", "7019", "7819", "7919", "7e19", "7721", "7326", *RECOVERY_MODELS}
)


@dataclass(frozen=True)
class RecoveryBoard:
    """A Jetson seen on USB in recovery mode."""

    sysfs_name: str  # e.g. "1-2.3": bus 1, port path 2.3
    product_id: str
    bus: str
    device_number: str
    serial: str | None

    @property
    def is_nano(self) -> bool:
        return self.product_id == NANO_RECOVERY_PRODUCT_ID

    @property
    def orin_model(self) -> str | None:
        return ORIN_RECOVERY_MODELS.get(self.product_id)

    @property
    def model(self) -> str | None:
        """The Orin or Thor module this id belongs to, None for others (the Nano included)."""
        return RECOVERY_MODELS.get(self.product_id)

    def describe(self) -> str:
        if self.is_nano:
            kind = "a Jetson Nano"
        elif self.model:
            kind = f"a {self.model}"
        else:
            kind = "a Jetson that is not a Nano"
        serial = f", serial {self.serial}" if self.serial else ""
        return (
            f"{kind} in recovery mode (USB {NVIDIA_VENDOR_ID}:{self.product_id}) at port "
            f"{self.sysfs_name} (bus {self.bus} device {self.device_number}{serial})"
        )


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def find_recovery_boards(root: Path = Path("/")) -> list[RecoveryBoard]:
    """Every Jetson in recovery mode, Nano or not; root is a prefix for fixture trees."""
    boards = []
    devices = root / "sys" / "bus" / "usb" / "devices"
    for device in sorted(devices.glob("*")):
        vendor = _read(device / "idVendor")
        product = (_read(device / "idProduct") or "").lower()
        if vendor != NVIDIA_VENDOR_ID:
            continue
        if product != NANO_RECOVERY_PRODUCT_ID and product not in OTHER_JETSON_RECOVERY_PRODUCT_IDS:
            continue  # an NVIDIA device that is not a Jetson in recovery (e.g. a running board)
        boards.append(
            RecoveryBoard(
                sysfs_name=device.name,
                product_id=product,
                bus=_read(device / "busnum") or "?",
                device_number=_read(device / "devnum") or "?",
                serial=_read(device / "serial"),
            )
        )
    return boards


class NotOneBoardInRecovery(Exception):
    """None, or more than one, of the boards a flashing path accepts is in recovery mode."""


@dataclass(frozen=True)
class RecoveryTarget:
    """The boards one flashing path accepts in recovery mode, and the words of its refusals."""

    name: str  # what is looked for: "Jetson Nano", or the Orin's MACHINE
    product_ids: frozenset[str]  # USB product ids (vendor 0955) of the accepted modules
    several: str  # plural when more than one is found: "Nanos", "boards for <MACHINE>"
    wanted: str  # "no <wanted> in recovery mode, but found ...": the module and its USB ids
    missing: str  # "no <missing> in recovery mode found on USB"
    flasher: str  # the program that flashes exactly one board
    wrong_module: str  # what to do when only other modules are in recovery mode
    recovery_howto: str


def module_target(yocto_machine: str, product_ids: frozenset[str], models: dict[str, str], wrong_module: str,
                  recovery_howto: str) -> RecoveryTarget:
    """A module that initrd-flash writes (the Orin's and Thor's), named by its MACHINE and USB ids."""
    expected = ", ".join(f"{NVIDIA_VENDOR_ID}:{pid} {models[pid]}" for pid in sorted(product_ids))
    return RecoveryTarget(
        name=yocto_machine,
        product_ids=product_ids,
        several=f"boards for {yocto_machine}",
        wanted=f"board for {yocto_machine} ({expected})",
        missing=f"{yocto_machine} ({expected})",
        flasher="initrd-flash",
        wrong_module=wrong_module,
        recovery_howto=recovery_howto,
    )


RECOVERY_HOWTO = (
    "put the Nano in recovery mode: power off, jumper FC REC to GND (pins 9-10 of J50 on "
    "the B01 devkit), power on, connect its micro-USB port straight to this host (no hub, "
    "no VM), then check with `lsusb -d 0955:`"
)
NANO = RecoveryTarget(
    name="Jetson Nano",
    product_ids=frozenset({NANO_RECOVERY_PRODUCT_ID}),
    several="Nanos",
    wanted=f"Jetson Nano ({NVIDIA_VENDOR_ID}:{NANO_RECOVERY_PRODUCT_ID})",
    missing="Jetson Nano",
    flasher="doflash.sh",
    wrong_module="these images are for the Nano only",
    recovery_howto=RECOVERY_HOWTO,
)


def select_recovery_board(boards: list[RecoveryBoard], target: RecoveryTarget) -> RecoveryBoard:
    """Exactly one board of the target's modules in recovery, or an error that says what was
    seen and what to do."""
    wanted = [board for board in boards if board.product_id in target.product_ids]
    others = [board for board in boards if board.product_id not in target.product_ids]
    if len(wanted) == 1:
        return wanted[0]
    if len(wanted) > 1:
        listing = "; ".join(board.describe() for board in wanted)
        raise NotOneBoardInRecovery(
            f"{len(wanted)} {target.several} are in recovery mode ({listing}); {target.flasher} flashes one: "
            "leave only the board you mean connected"
        )
    if others:
        listing = "; ".join(board.describe() for board in others)
        raise NotOneBoardInRecovery(
            f"no {target.wanted} in recovery mode, but found {listing}: {target.wrong_module}"
        )
    raise NotOneBoardInRecovery(f"no {target.missing} in recovery mode found on USB; {target.recovery_howto}")
