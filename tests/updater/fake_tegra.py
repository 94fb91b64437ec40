"""A simulated Jetson Orin/Thor for the agent's tests, modelled on meta-mender-tegra's native
scheme (wrynose; files at meta-mender-community f6860e09 and 72093c00) and L4T's paired A/B
boot chain and root filesystem:

- two boot chains (A/B, each with its boot firmware version) and two root filesystem slots
  (APP, APP_b) paired to them: UEFI boots the root filesystem of the chain it boots;
- `mender-update` acts as standalone Mender driving the `tegra-rootfs-image` module: install
  writes the passive root filesystem (DownloadWithFileSizes) and stages the capsule on the
  ESP with OsIndications armed and the pending marker naming the target slot
  (ArtifactInstall); commit runs `nvbootctrl verify` and drops the marker (ArtifactCommit);
  rollback removes a staged capsule, disarms OsIndications, drops the marker and, when the
  running slot is not the one it left, `nvbootctrl set-active-boot-slot ORIG`
  (ArtifactRollback);
- `TegraBoard.power_cycle()` is the boot firmware: a staged, armed capsule is written into
  the other chain, which becomes active, and the board resets again (the second reboot);
  UEFI counts the boots of each root filesystem slot (RootfsRetryCount, max 1): a slot whose
  count is used up is marked unbootable and the other chain boots; a slot that hangs is reset
  by the watchdog; once Linux is up, tegra-rootfs-verify.service marks the slot good unless
  the pending marker names it, and nv_update_verifier.service (when an image starts it)
  marks it good regardless, unless the layer's drop-in runs the marker-aware verifier instead;
- `nvbootctrl` answers get-current-slot, dump-slots-info, verify, set-active-boot-slot, and
  `systemctl show` says whether a unit ran in this boot and what it runs.
/data (the pending marker, the agent's state) is one directory both slots see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_board import SimulatedNode

OS_INDICATIONS = "OsIndications-8be4df61-93ca-11d2-aa0d-00e098032b8c"
ATTRIBUTES = b"\x07\x00\x00\x00"  # NV, BS, RT

# Slot handling shared by nvbootctrl and the update module (which calls nvbootctrl).
_TEGRA = """
P = s["paths"]
def other(slot):
    return 1 - slot
def letter(slot):
    return "AB"[slot]
def pending_target():
    try:
        return int(open(P["pending"]).read().strip())
    except FileNotFoundError:
        return None
def remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
def set_os_indications(value):
    with open(P["os_indications"], "wb") as f:
        f.write(b"\\x07\\x00\\x00\\x00" + value.to_bytes(8, "little"))
def nvbootctrl(a, record=True):
    if record:
        s["calls"].append(["nvbootctrl", *a])
    rootfs = a[:2] == ["-t", "rootfs"]
    if rootfs:
        a = a[2:]
    if a[0] == "get-current-slot":
        print(s["rootfs_current"] if rootfs else s["chain_current"])
    elif a[0] == "dump-slots-info" and rootfs:
        print("Current rootfs slot: %s" % letter(s["rootfs_current"]))
        print("Active rootfs slot: %s" % letter(s["chain_active"]))
        print("num_slots: 2")
        for n in (0, 1):
            print("slot: %d,             retry_count: %d,             status: %s"
                  % (n, s["retry"][str(n)], s["rootfs_status"][str(n)]))
    elif a[0] == "dump-slots-info":
        print("Current version: 39.2.0")
        print("Capsule update status: %d" % s["capsule_status"])
        print("Current bootloader slot: %s" % letter(s["chain_current"]))
        print("Active bootloader slot: %s" % letter(s["chain_active"]))
        print("num_slots: 2")
        for n in (0, 1):
            print("slot: %d,             status: normal" % n)
    elif a[0] == "verify":
        slot = str(s["rootfs_current"])
        s["retry"][slot] = s["retry_max"]
        s["rootfs_status"][slot] = "normal"
        s["verified"].append([s["boots"], int(slot)])
    elif a[0] == "set-active-boot-slot":
        s["chain_active"] = int(a[1])
    else:
        print("nvbootctrl: unknown command " + " ".join(a), file=sys.stderr)
        return 1
    return 0
"""

_NVBOOTCTRL = _TEGRA + """
code = nvbootctrl(args)
save(s)
sys.exit(code)
"""

_SYSTEMCTL = """
save(s)
if args[:1] == ["show"]:
    unit = args[-1]
    command = s["unit_commands"].get(unit, "")
    values = {"ExecMainStartTimestampMonotonic": "123456789" if unit in s["units_ran"] else "0",
              "ExecStart": "{ path=%s ; argv[]=%s ; ignore_errors=no }" % (command.split()[0], command)
              if command else ""}
    for arg in args[1:-1]:
        if arg.startswith("--property="):
            name = arg.split("=", 1)[1]
            print("%s=%s" % (name, values.get(name, "")))
    sys.exit(0)
print("fake systemctl: unexpected " + " ".join(args), file=sys.stderr)
sys.exit(1)
"""

NVBOOTCTRL_VERIFY = "/usr/sbin/nvbootctrl verify"  # meta-tegra's nv_update_verifier.service
MARKER_AWARE_VERIFY = "/usr/sbin/tegra-rootfs-verify"  # the layer's drop-in for it

_MENDER = _TEGRA + """
s["calls"].append(["mender-update", *args])
def cleanup():
    s["stash"] = None
    remove(P["pending"])
if args[0] == "install":
    artifact = s["artifacts"].get(args[1])
    if s["in_progress"]:
        save(s); print("Update already in progress. Please commit or roll back first"); sys.exit(1)
    if artifact is None:
        save(s); print("Could not fulfill request: 404 Not Found"); sys.exit(1)
    s["in_progress"] = {"artifact": artifact["name"], "state": "Download"}
    if artifact.get("kill_caller_during_install"):
        artifact["kill_caller_during_install"] -= 1
        save(s); os.kill(os.getppid(), signal.SIGKILL); sys.exit(1)
    # DownloadWithFileSizes: the passive APP/APP_b, flagged unbootable while written
    current = s["rootfs_current"]
    if current != s["chain_current"]:
        save(s); print("tegra-rootfs-image[DownloadWithFileSizes]: FATAL: slot mapping"); sys.exit(1)
    target = other(current)
    s["rootfs_status"][str(target)] = "unbootable"
    s["rootfs"][str(target)] = artifact["name"]
    s["stash"] = artifact.get("firmware", "fw-" + artifact["name"])
    s["written_slot"] = target
    # ArtifactInstall: remember the slot, stage and arm the capsule, mark the update pending
    s["orig_slot"] = current
    s["rootfs_status"][str(target)] = "normal"
    os.makedirs(os.path.dirname(P["capsule"]), exist_ok=True)
    with open(P["capsule"], "w") as f:
        f.write(s["stash"])
    with open(P["pending"], "w") as f:
        f.write("%d\\n" % target)
    set_os_indications(4)
    s["in_progress"]["state"] = "ArtifactInstall"
    save(s); print("Installed, but not committed."); sys.exit(0)
if args[0] == "commit":
    if not s["in_progress"]:
        save(s); print("No update in progress."); sys.exit(2)
    nvbootctrl(["verify"])
    remove(P["pending"])
    cleanup()
    s["committed"].append(s["in_progress"]["artifact"]); s["in_progress"] = None; s["orig_slot"] = None
    save(s); print("Committed."); sys.exit(0)
if args[0] == "rollback":
    if not s["in_progress"]:
        save(s); print("No update in progress."); sys.exit(2)
    remove(P["capsule"])
    set_os_indications(0)
    remove(P["pending"])
    if s["orig_slot"] is not None and s["rootfs_current"] != s["orig_slot"]:
        nvbootctrl(["set-active-boot-slot", str(s["orig_slot"])])
    cleanup()
    s["in_progress"] = None; s["orig_slot"] = None
    save(s); print("Rolled back."); sys.exit(0)
save(s); print("No such action: " + args[0]); sys.exit(1)
"""

TEGRA_BIN_TOOLS = ("mender-update", "nvbootctrl", "systemctl")


class TegraBoard(SimulatedNode):
    """One simulated Jetson Orin (or Thor): see the module's docstring."""

    backend = "mender-tegra"

    def __init__(self, root: Path, running: str = "gpu-k8s-1.0.0", firmware: str = "fw-1.0.0",
                 device_type: str = "jetson-orin-nano-devkit-nvme") -> None:
        root.mkdir(parents=True)
        self.paths = {
            "pending": str(root / "data" / "mender" / "tegra-update-pending"),
            "capsule": str(root / "esp" / "EFI" / "UpdateCapsule" / "TEGRA_BL.Cap"),
            "os_indications": str(root / "efivars" / OS_INDICATIONS),
            "module": str(root / "usr-share-mender-modules-v3" / "tegra-rootfs-image"),
        }
        for name in ("pending", "os_indications", "module"):
            Path(self.paths[name]).parent.mkdir(parents=True, exist_ok=True)
        Path(self.paths["module"]).write_text("#!/bin/sh\n")
        Path(self.paths["os_indications"]).write_bytes(ATTRIBUTES + bytes(8))
        super().__init__(root, {
            "paths": self.paths,
            "firmware": {"0": firmware, "1": firmware},
            "rootfs": {"0": running, "1": "gpu-k8s-0.0.0"},
            "chain_active": 0, "chain_current": 0, "rootfs_current": 0,
            "rootfs_status": {"0": "normal", "1": "normal"},
            "retry": {"0": 1, "1": 1}, "retry_max": 1,
            "capsule_status": 0, "stash": None, "orig_slot": None, "written_slot": None,
            "hangs": [],  # releases whose root filesystem never comes up (the watchdog resets)
            "verifier_enabled_in": [],  # releases whose image starts nv_update_verifier at boot
            # its command: meta-tegra's, or the layer's drop-in (marker-aware, stands down while pending)
            "unit_commands": {"nv_update_verifier.service": NVBOOTCTRL_VERIFY,
                              "tegra-rootfs-verify.service": MARKER_AWARE_VERIFY},
            "firmware_skips_capsule": 0,  # resets on which the firmware leaves the capsule alone
            "firmware_rejects_capsule": False,  # e.g. a capsule for another FMP GUID
            "rootfs_override": None,  # a root filesystem slot UEFI boots whatever the chain (a broken pairing)
            "units_ran": [], "verified": [], "resets": 0, "boot_log": [],
        }, {"mender-update": _MENDER, "nvbootctrl": _NVBOOTCTRL, "systemctl": _SYSTEMCTL}, device_type)

    # --- what the tests look at --------------------------------------------------------
    @property
    def pending(self) -> bool:
        return Path(self.paths["pending"]).exists()

    @property
    def capsule_staged(self) -> bool:
        return Path(self.paths["capsule"]).exists()

    @property
    def os_indications_armed(self) -> bool:
        return bool(int.from_bytes(Path(self.paths["os_indications"]).read_bytes()[4:], "little") & 4)

    def booted(self) -> tuple[str, str, str]:
        """(boot chain letter, its boot firmware, the booted root filesystem's release)."""
        state = self.state()
        chain = state["chain_current"]
        return "AB"[chain], state["firmware"][str(chain)], state["rootfs"][str(state["rootfs_current"])]

    def nvbootctrl_calls(self, *command: str) -> int:
        return sum(1 for call in self.state()["calls"] if call[:1] == ["nvbootctrl"] and call[1:] == list(command))

    def booted_artifact(self, state: dict[str, Any]) -> str:
        return state["rootfs"][str(state["rootfs_current"])]

    def booted_slot(self) -> str:
        return str(self.state()["rootfs_current"])

    def written_slot(self) -> str:
        return str(self.state()["written_slot"])

    def environment(self, kubelet_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        return super().environment(kubelet_url, {
            "GPU_K8S_UPDATE_TEGRA_PENDING_FILE": self.paths["pending"],
            "GPU_K8S_UPDATE_ESP_CAPSULE": self.paths["capsule"],
            "GPU_K8S_UPDATE_EFIVARS_DIR": str(Path(self.paths["os_indications"]).parent),
            "GPU_K8S_UPDATE_TEGRA_UPDATE_MODULE": self.paths["module"],
            **(extra or {}),
        })

    # --- the boot firmware -------------------------------------------------------------
    def power_cycle(self) -> list[str]:
        """Reset the board and run the firmware until Linux is up; returns this cycle's boot log."""
        state = self.state()
        log: list[str] = []
        capsule, efivar = Path(self.paths["capsule"]), Path(self.paths["os_indications"])
        for _ in range(8):
            state["resets"] += 1
            chain = state["chain_active"]
            armed = bool(int.from_bytes(efivar.read_bytes()[4:], "little") & 4)
            if capsule.exists() and armed:
                if state["firmware_skips_capsule"] > 0:
                    state["firmware_skips_capsule"] -= 1
                    log.append("firmware: capsule left staged on this reset")
                elif state["firmware_rejects_capsule"]:
                    capsule.unlink()
                    efivar.write_bytes(ATTRIBUTES + bytes(8))
                    state["capsule_status"] = 3
                    log.append("firmware: capsule rejected (its image type GUID does not match)")
                else:
                    new = 1 - chain
                    state["firmware"][str(new)] = capsule.read_text()
                    state["chain_active"] = new
                    capsule.unlink()
                    efivar.write_bytes(ATTRIBUTES + bytes(8))
                    state["capsule_status"] = 1
                    log.append(f"firmware: capsule written to boot chain {'AB'[new]}, chain switched; reset")
                    continue
            slot = chain if state["rootfs_override"] is None else state["rootfs_override"]
            key = str(slot)
            if state["rootfs_status"][key] == "unbootable" or state["retry"][key] == 0:
                state["rootfs_status"][key] = "unbootable"
                state["chain_active"] = 1 - chain
                log.append(f"UEFI: root filesystem {'AB'[slot]} used up its retries: unbootable, boot chain "
                           f"{'AB'[1 - chain]}; reset")
                continue
            state["retry"][key] -= 1
            state["chain_current"], state["rootfs_current"] = chain, slot
            if state["rootfs"][key] in state["hangs"]:
                log.append(f"Linux on {'AB'[slot]} ({state['rootfs'][key]}) hung: watchdog reset")
                continue
            state["boots"] += 1
            log.append(f"Linux up on boot chain {'AB'[chain]}, root filesystem {'AB'[slot]} ({state['rootfs'][key]})")
            self._boot_units(state, slot)
            state["boot_log"].extend(log)
            self._save(state)
            self._linux_up()
            return log
        raise AssertionError("the board never came up: " + "; ".join(log))

    def _boot_units(self, state: dict[str, Any], slot: int) -> None:
        """tegra-rootfs-verify.service and, if the image enables it, nv_update_verifier.service."""
        state["units_ran"] = ["tegra-rootfs-verify.service"]
        pending = Path(self.paths["pending"])
        target = int(pending.read_text()) if pending.exists() else None
        release = state["rootfs"][str(slot)]
        if target != slot:
            self._verify(state, slot)
        if release in state["verifier_enabled_in"]:
            state["units_ran"].append("nv_update_verifier.service")
            if state["unit_commands"]["nv_update_verifier.service"] == NVBOOTCTRL_VERIFY or target != slot:
                self._verify(state, slot)

    @staticmethod
    def _verify(state: dict[str, Any], slot: int) -> None:
        state["retry"][str(slot)] = state["retry_max"]
        state["rootfs_status"][str(slot)] = "normal"
        state["verified"].append([state["boots"], slot])
