"""Jetson Orin and Thor: meta-mender-tegra's native scheme (wrynose). Mender's update module
`tegra-rootfs-image` writes the passive APP/APP_b partition, stages the boot-firmware capsule
(TEGRA_BL.Cap on the ESP, OsIndications armed) and leaves /var/lib/mender/tegra-update-pending
naming the slot it aims at. On the next reboot the firmware writes the capsule into the other
boot chain, makes that chain active and resets again; the root filesystem slot is paired to
the boot chain and follows. Commit is `nvbootctrl verify` (the module's ArtifactCommit);
rollback removes a staged capsule, disarms OsIndications and switches the boot chain back with
`nvbootctrl set-active-boot-slot`, which takes the root filesystem with it. A new slot left
unverified falls back on its own: UEFI counts its boots (RootfsRetryCount) and, after a
watchdog reset, boots the other chain.

What the module cannot do for us in standalone mode, this backend does: `mender-update commit`
never runs the module's ArtifactVerifyReboot, so pending() reports a boot chain and root
filesystem that disagree; and it reports a slot marked good before the gate (meta-tegra's
nv_update_verifier.service runs `nvbootctrl verify` on every boot: meta-mender-tegra disables
it, and our layer's drop-in points it at the marker-aware tegra-rootfs-verify should anything
start it; an image where it still runs nvbootctrl verify itself has lost its fallback)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from gpu_k8s_update.ab.mender import MenderBackend
from gpu_k8s_update.model import BootState
from gpu_k8s_update.system import SystemStateError, run_command

UPDATE_MODULE = "tegra-rootfs-image"
# EFI global variable OsIndications: bit 2 asks the firmware to process capsules on disk.
OS_INDICATIONS = "OsIndications-8be4df61-93ca-11d2-aa0d-00e098032b8c"
CAPSULE_ON_DISK = 0x4
# meta-tegra's unit that marks the booted slot good at every boot, pending update or not
# (meta-mender-tegra's native scheme disables it; the layer points it at the marker-aware
# verifier should anything start it).
BOOT_VERIFIERS = ("nv_update_verifier.service",)


def slot_letter(slot: int) -> str:
    return "AB"[slot] if slot in (0, 1) else str(slot)


def parse_slots_info(text: str) -> dict[str, str]:
    """`nvbootctrl [-t rootfs] dump-slots-info`: 'Current bootloader slot: A', 'Capsule update
    status: 1', 'slot: 0, retry_count: 1, status: normal' ... as flat names."""
    info: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        slot = re.match(r"slot:\s*(\d+)\s*,(.*)$", line)
        if slot:
            letter = slot_letter(int(slot.group(1)))
            for part in slot.group(2).split(","):
                name, sep, value = part.partition(":")
                if sep:
                    info[f"slot_{letter}_{name.strip().replace(' ', '_')}"] = value.strip()
            continue
        name, sep, value = line.partition(":")
        if sep and value.strip():
            info[name.strip().lower().replace(" ", "_")] = value.strip()
    return info


def unit_verifies_unconditionally(exec_start: str) -> bool:
    """`systemctl show -p ExecStart`: '{ path=/usr/sbin/nvbootctrl ; argv[]=/usr/sbin/nvbootctrl
    verify ; ... }'. meta-tegra's unit runs nvbootctrl verify; a drop-in that runs
    tegra-rootfs-verify instead stands down while an update is pending."""
    argv = re.search(r"argv\[\]=([^;]*)", exec_start)
    words = argv.group(1).split() if argv else exec_start.split()
    return bool(words) and Path(words[0]).name == "nvbootctrl" and "verify" in words[1:]


def os_indications_armed(efivar: Path) -> bool:
    """efivarfs files hold 4 bytes of attributes, then the value (little-endian UINT64)."""
    try:
        data = efivar.read_bytes()
    except OSError:
        return False
    return len(data) > 4 and bool(int.from_bytes(data[4:12], "little") & CAPSULE_ON_DISK)


class MenderTegra(MenderBackend):
    name = "mender-tegra"

    def __init__(self, mender_command: Sequence[str], image_info: Path, *, nvbootctrl: Sequence[str],
                 systemctl: Sequence[str], pending_file: Path, update_module: Path, esp_capsule: Path,
                 efivars_dir: Path) -> None:
        super().__init__(mender_command, image_info)
        self.nvbootctrl = list(nvbootctrl)
        self.systemctl = list(systemctl)
        self.pending_file = pending_file
        self.update_module = update_module
        self.esp_capsule = esp_capsule
        self.efivars_dir = efivars_dir
        self.tools = (self.nvbootctrl[0],)

    def missing(self) -> list[str]:
        missing = super().missing()
        if not self.update_module.is_file():
            missing.append(f"Mender's {UPDATE_MODULE} update module ({self.update_module}) is not installed")
        return missing

    # ---- nvbootctrl ---------------------------------------------------------------------
    def _slot(self, *target: str) -> int:
        result = run_command([*self.nvbootctrl, *target, "get-current-slot"], timeout_s=60)
        text = result.last_line.strip()
        if result.returncode != 0 or not text.isdigit():
            raise SystemStateError(
                f"'{' '.join([*self.nvbootctrl, *target, 'get-current-slot'])}' failed (exit {result.returncode}): "
                f"{result.last_line or 'no output'}"
            )
        return int(text)

    def rootfs_slot(self) -> int:
        return self._slot("-t", "rootfs")

    def boot_chain(self) -> int:
        return self._slot()

    def pending_target(self) -> int | None:
        """The slot the module's pending marker names (written at install, removed at commit,
        rollback and cleanup; on /data, so both slots see it)."""
        try:
            text = self.pending_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise SystemStateError(f"cannot read {self.pending_file}: {error.strerror}") from None
        if not text.isdigit():
            raise SystemStateError(f"{self.pending_file} names no slot ({text!r})")
        return int(text)

    def capsule_staged(self) -> bool:
        return self.esp_capsule.is_file() and os_indications_armed(self.efivars_dir / OS_INDICATIONS)

    def _verified_at_boot(self, unit: str) -> bool:
        """The unit ran in this boot and its command is `nvbootctrl verify` itself, not the
        marker-aware tegra-rootfs-verify (which the layer's drop-in puts in its place)."""
        result = run_command([*self.systemctl, "show", "--property=ExecMainStartTimestampMonotonic",
                              "--property=ExecStart", unit], timeout_s=60)
        if result.returncode != 0:
            return False
        shown = dict(line.partition("=")[::2] for line in result.output.splitlines() if "=" in line)
        started = shown.get("ExecMainStartTimestampMonotonic", "0").strip()
        return started.isdigit() and int(started) > 0 and unit_verifies_unconditionally(shown.get("ExecStart", ""))

    # ---- the interface --------------------------------------------------------------------
    def pending(self) -> BootState:
        target = self.pending_target()
        rootfs, chain = self.rootfs_slot(), self.boot_chain()
        problem = ""
        if rootfs != chain:
            problem = (f"boot chain {slot_letter(chain)} runs root filesystem slot {slot_letter(rootfs)}: the pair "
                       "did not switch together")
        if target is None:
            return BootState(pending=False, slot_problem=problem)
        if rootfs != target:
            return BootState(pending=True, switch_staged=self.capsule_staged(), slot_problem=problem)
        early = [f"{unit} ran 'nvbootctrl verify' in this boot (it does at every boot, pending update or not)"
                 for unit in BOOT_VERIFIERS if shutil.which(self.systemctl[0]) and self._verified_at_boot(unit)]
        return BootState(pending=True, committed_early="; ".join(early), slot_problem=problem)

    def slots(self) -> dict[str, str]:
        report = {"rootfs_slot": slot_letter(self.rootfs_slot()), "boot_chain": slot_letter(self.boot_chain())}
        target = self.pending_target()
        report["pending_target"] = slot_letter(target) if target is not None else "none"
        report["capsule_staged"] = "yes" if self.capsule_staged() else "no"
        for kind, args in (("bootloader", []), ("rootfs", ["-t", "rootfs"])):
            result = run_command([*self.nvbootctrl, *args, "dump-slots-info"], timeout_s=60)
            if result.returncode == 0:
                report.update({f"{kind}_{name}": value for name, value in parse_slots_info(result.output).items()})
        return report
