"""Jetson Orin (and Thor, the same route) through the real CLI on a simulated Tegra board
(fake_tegra.py: meta-mender-tegra's native scheme, L4T's paired boot chain and root
filesystem, UEFI's retry count, the watchdog), provisioned at flash time the way `./task
flash` writes the data partition (tools/flash/provision.py), with the layer's real gpu-k8s-data,
k3s-agent-configured and node-name scripts (provisioning.py)."""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_board import HealthServer, describe, run_agent
from fake_tegra import TegraBoard
from gpu_k8s_update.ab.tegra import parse_slots_info
from provisioning import SERIAL, Disks, gate_env, start_k3s

from tools.flash.provision import Provisioning, node_files, validate

ORIN = "jetson-orin-nano-devkit-nvme"
URL = f"https://updates.example/1.1.0/gpu-k8s-image-{ORIN}.mender"
OLD, NEW = "gpu-k8s-1.0.0", "gpu-k8s-1.1.0"
OLD_FW, NEW_FW = "fw-1.0.0", "fw-1.1.0"
KILLED = -signal.SIGKILL


@dataclass
class Orin:
    board: TegraBoard
    disks: Disks
    kubelet: HealthServer
    role: str

    def env(self, **extra: str) -> dict[str, str]:
        return {**gate_env(self.disks, self.kubelet), **extra}

    def upgrade(self, **extra: str) -> subprocess.CompletedProcess[str]:
        return run_agent(self.env(**extra), "upgrade", "--version", "1.1.0", "--artifact-url", URL)

    def gate(self, **extra: str) -> subprocess.CompletedProcess[str]:
        return run_agent(self.env(**extra), "gate")

    def start_k3s(self) -> str | None:
        return start_k3s(self.disks, self.kubelet, self.role)

    def install(self) -> None:
        """The rollout job's first run: install, then killed by its own reboot."""
        self.board.publish(URL, NEW, firmware=NEW_FW)
        job = self.upgrade()
        assert job.returncode == KILLED, "the upgrade ends killed by its own reboot\n" + describe(job)
        assert self.board.capsule_staged and self.board.os_indications_armed and self.board.pending

    def reboot(self, write_new_slot: bool = True) -> list[str]:
        """The reboot: gpu-k8s-data keeps provisioning written since boot, the slot the install
        wrote holds the new image, then the firmware runs until Linux is up."""
        self.disks.data_unit("--adopt")
        if write_new_slot:
            self.disks.write_image(self.board.written_slot())
        resets = self.board.state()["resets"]
        log = self.disks.power_cycle()
        log.append(f"({self.board.state()['resets'] - resets} resets)")
        return log


def provision_at_flash(disks: Disks, role: str, tmp_path: Path) -> None:
    """What `./task flash --machine jetson-orin-nano-nvme --role ... [--server-url --token-file]`
    writes onto the data partition."""
    if role == "agent":
        token = tmp_path / "node-token"
        token.write_text("K10abc::server:secret\n")
        wanted = Provisioning(server_url="https://k3s-server.lan:6443", token_file=token, role="agent")
    else:
        wanted = Provisioning(role="server", labels=("site=lab-2",))
    for path, (content, mode) in node_files(wanted, validate(wanted)).items():
        target = disks.data / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(mode)


def flashed_orin(tmp_path: Path, kubelet: HealthServer, role: str) -> Orin:
    board = TegraBoard(tmp_path / "orin")
    disks = Disks(board, ("0", "1"), hostname=ORIN)
    disks.write_image("0")
    provision_at_flash(disks, role, tmp_path)
    disks.data_unit()  # the first boot links the provisioning into /etc
    node = Orin(board, disks, kubelet, role)
    assert node.start_k3s() == f"{ORIN}-{SERIAL}", "k3s names the node from the Jetson serial"
    assert board.booted() == ("A", OLD_FW, OLD)
    return node


@pytest.fixture(params=["agent", "server"])
def orin(request: pytest.FixtureRequest, tmp_path: Path, kubelet: HealthServer) -> Orin:
    """An Orin agent and an Orin server, each provisioned at flash time."""
    return flashed_orin(tmp_path, kubelet, request.param)


@pytest.fixture()
def orin_agent(tmp_path: Path, kubelet: HealthServer) -> Orin:
    return flashed_orin(tmp_path, kubelet, "agent")


def test_an_orin_provisioned_at_flash_time_updates_across_two_reboots_and_commits(orin: Orin) -> None:
    board = orin.board
    orin.install()
    log = orin.reboot()
    assert log[-1] == "(2 resets)", "the firmware applies the capsule and resets once more: " + "; ".join(log)
    assert board.booted() == ("B", NEW_FW, NEW), "the new boot chain with the new root filesystem"
    assert board.pending and board.state()["retry"]["1"] == 0, "tegra-rootfs-verify left the new slot unverified"
    early = orin.upgrade(GPU_K8S_UPDATE_WAIT_FOR_GATE_S="0.3")
    assert early.returncode == 4 and "has not decided" in early.stderr, describe(early)
    assert board.mender_calls("commit") == 0 and board.nvbootctrl_calls("verify") == 0, "no commit before the gate"
    name = orin.start_k3s()
    assert name == f"{ORIN}-{SERIAL}", "the same node after the update"
    gate = orin.gate()
    assert gate.returncode == 0, describe(gate)
    reason = board.gate_result()["reason"]
    assert "node Ready" in reason and "1 nvidia.com/gpu allocatable" in reason, reason
    assert "device plugin registered" in reason and "unreachable" not in reason, reason
    asked = [call for call in board.state()["calls"] if call[:1] == ["kubectl"] and "node" in call]
    assert asked and all(name in call for call in asked), "the cluster was asked about the name k3s registers"
    assert board.nvbootctrl_calls("verify") == 1, "the commit is the module's nvbootctrl verify"
    assert not board.pending and board.state()["retry"]["1"] == 1
    job = orin.upgrade()
    assert job.returncode == 0, describe(job)
    assert board.marker() is None and board.mender_calls("install") == 1
    orin.reboot(write_new_slot=False)
    assert board.booted() == ("B", NEW_FW, NEW), "a committed slot survives the next reboot"
    config = orin.disks.active() / "etc/rancher/k3s/config.yaml"
    assert config.is_symlink(), "the provisioning from the flash is still the kept copy on /data"
    if orin.role == "agent":
        assert "k3s-server.lan" in config.read_text()
        assert (orin.disks.active() / "etc/rancher/k3s/token").read_text().startswith("K10abc")
    else:
        assert "site=lab-2" in config.read_text()


def test_a_failed_gate_returns_the_old_boot_chain_and_root_filesystem_together(orin: Orin) -> None:
    board = orin.board
    orin.install()
    orin.reboot()
    assert board.booted() == ("B", NEW_FW, NEW)
    orin.start_k3s()
    orin.kubelet.set_status(500)
    gate = orin.gate()
    assert gate.returncode == KILLED, "the gate reboots without committing\n" + describe(gate)
    verdict = board.gate_result()
    assert verdict["outcome"] == "rolled-back" and "kubelet" in verdict["reason"], verdict
    assert board.nvbootctrl_calls("set-active-boot-slot", "0") == 1, "the boot chain is sent back"
    assert board.nvbootctrl_calls("verify") == 0 and board.state()["committed"] == []
    assert not board.pending and not board.capsule_staged and not board.os_indications_armed
    log = orin.reboot(write_new_slot=False)
    assert log[-1] == "(1 resets)", log
    assert board.booted() == ("A", OLD_FW, OLD), "old boot chain, old firmware, old root filesystem"
    orin.start_k3s()
    orin.kubelet.set_status(200)
    job = orin.upgrade()
    assert job.returncode == 3, describe(job)
    assert f"back on {OLD}" in job.stderr and "kubelet" in job.stderr, "the job names the gate's reason"
    assert "not whole" not in job.stderr, "boot chain and root filesystem agree"
    assert orin.upgrade().returncode == 3, "re-running keeps the rollout stopped"
    assert board.mender_calls("install") == 1


def test_a_hung_new_slot_is_reset_by_the_watchdog_and_falls_back_to_the_old_chain(orin: Orin) -> None:
    board = orin.board
    board.change(hangs=[NEW])
    orin.install()
    log = orin.reboot()
    assert any("hung: watchdog reset" in line for line in log), log
    assert any("used up its retries" in line for line in log), log
    assert board.booted() == ("A", OLD_FW, OLD), "; ".join(log)
    assert board.state()["rootfs_status"]["1"] == "unbootable"
    assert board.pending, "the module's marker still names the slot that never came up"
    gate = orin.gate()
    assert gate.returncode == 0, "the gate on the old slot judges nothing\n" + describe(gate)
    assert board.mender_calls("commit") == 0 and board.mender_calls("rollback") == 0
    orin.start_k3s()
    job = orin.upgrade()
    assert job.returncode == 3, describe(job)
    assert "no gate verdict" in job.stderr and f"back on {OLD}" in job.stderr
    assert board.mender_calls("rollback") == 1, "Mender's leftover update is cleared for the next install"
    assert board.nvbootctrl_calls("set-active-boot-slot", "0") == 0, "already on the original slot: no switch"
    assert not board.pending and board.state()["in_progress"] is None
    orin.reboot(write_new_slot=False)
    assert board.booted() == ("A", OLD_FW, OLD), "the old slot stays"


def test_an_extra_boot_of_the_old_slot_before_the_capsule_applies_is_neither_judged_nor_a_failure(
        orin_agent: Orin) -> None:
    orin = orin_agent
    board = orin.board
    board.change(firmware_skips_capsule=1)
    orin.install()
    orin.reboot()
    assert board.booted() == ("A", OLD_FW, OLD) and board.capsule_staged and board.os_indications_armed
    gate = orin.gate()
    assert gate.returncode == 0 and "switches slots on the next reset" in gate.stderr, describe(gate)
    assert board.gate_result() is None and board.mender_calls("rollback") == 0
    orin.start_k3s()
    job = orin.upgrade()
    assert job.returncode == KILLED, "the job reboots again instead of reporting a rollback\n" + describe(job)
    assert board.marker()["switch_reboots"] == 1 and board.mender_calls("install") == 1
    log = orin.reboot(write_new_slot=False)
    assert log[-1] == "(2 resets)" and board.booted() == ("B", NEW_FW, NEW), log
    orin.start_k3s()
    assert orin.gate().returncode == 0
    assert orin.upgrade().returncode == 0


def test_a_firmware_that_never_applies_the_capsule_stops_the_rollout_after_bounded_reboots(orin_agent: Orin) -> None:
    orin = orin_agent
    board = orin.board
    board.change(firmware_skips_capsule=10)
    orin.install()
    for attempt in (1, 2):
        orin.reboot(write_new_slot=attempt == 1)
        job = orin.upgrade()
        assert job.returncode == KILLED, describe(job)
    orin.reboot(write_new_slot=False)
    job = orin.upgrade()
    assert job.returncode == 3, describe(job)
    assert "did not apply the update capsule" in job.stderr
    assert not board.capsule_staged and not board.os_indications_armed, "the cleanup disarms the capsule"
    assert board.booted() == ("A", OLD_FW, OLD)


def test_a_capsule_the_firmware_rejects_ends_on_the_old_slot_and_stops_the_rollout(orin_agent: Orin) -> None:
    orin = orin_agent
    board = orin.board
    board.change(firmware_rejects_capsule=True)
    orin.install()
    orin.reboot()
    assert board.booted() == ("A", OLD_FW, OLD) and not board.capsule_staged
    assert board.state()["firmware"]["1"] == OLD_FW, "no boot chain was written"
    orin.start_k3s()
    job = orin.upgrade()
    assert job.returncode == 3, describe(job)
    status = json.loads(run_agent(orin.env(), "status").stdout)
    assert status["slots"]["bootloader_capsule_update_status"] == "3", status["slots"]


def test_a_new_image_that_marks_its_slot_good_at_boot_is_not_committed(orin_agent: Orin) -> None:
    """meta-tegra's nv_update_verifier.service left enabled: `nvbootctrl verify` at every boot."""
    orin = orin_agent
    board = orin.board
    board.change(verifier_enabled_in=[NEW])
    orin.install()
    orin.reboot()
    assert board.booted() == ("B", NEW_FW, NEW) and board.state()["retry"]["1"] == 1, "verified at boot"
    orin.start_k3s()
    gate = orin.gate()
    assert gate.returncode == KILLED, describe(gate)
    reason = board.gate_result()["reason"]
    assert "nv_update_verifier.service ran 'nvbootctrl verify' in this boot" in reason, reason
    assert board.state()["committed"] == [] and board.nvbootctrl_calls("set-active-boot-slot", "0") == 1
    orin.reboot(write_new_slot=False)
    assert board.booted() == ("A", OLD_FW, OLD)
    orin.start_k3s()
    job = orin.upgrade()
    assert job.returncode == 3 and "nv_update_verifier" in job.stderr, describe(job)


def test_nv_update_verifier_pointed_at_the_marker_aware_verifier_leaves_the_new_slot_to_the_gate(
        orin_agent: Orin) -> None:
    """The layer's drop-in: nv_update_verifier runs tegra-rootfs-verify, should anything start it."""
    orin = orin_agent
    board = orin.board
    state = board.state()
    state["unit_commands"]["nv_update_verifier.service"] = "/usr/sbin/tegra-rootfs-verify"
    board.change(verifier_enabled_in=[NEW], unit_commands=state["unit_commands"])
    orin.install()
    orin.reboot()
    assert "nv_update_verifier.service" in board.state()["units_ran"], "it did run"
    assert board.state()["retry"]["1"] == 0, "and left the pending slot unverified"
    orin.start_k3s()
    gate = orin.gate()
    assert gate.returncode == 0, describe(gate)
    assert board.gate_result()["outcome"] == "committed"


def test_a_slot_committed_by_hand_before_the_gate_fails_the_job(orin_agent: Orin) -> None:
    orin = orin_agent
    board = orin.board
    orin.install()
    orin.reboot()
    commit = subprocess.run([str(board.bin / "mender-update"), "commit"], capture_output=True, text=True, check=False)
    assert commit.returncode == 0
    orin.start_k3s()
    gate = orin.gate()
    assert gate.returncode == 0 and "committed, but not by this gate" in gate.stderr, describe(gate)
    assert board.gate_result()["outcome"] == "committed-elsewhere"
    job = orin.upgrade()
    assert job.returncode == 7 and "never passed it" in job.stderr, describe(job)
    assert run_agent(orin.env(), "forget").returncode == 0
    assert orin.upgrade().returncode == 0, "once a person has looked, the node counts as done"


def test_a_boot_chain_and_root_filesystem_that_did_not_switch_together_are_not_committed(orin_agent: Orin) -> None:
    orin = orin_agent
    board = orin.board
    board.change(firmware_rejects_capsule=True, rootfs_override=1)
    orin.install()
    orin.reboot()
    chain, firmware, release = board.booted()
    assert (chain, firmware, release) == ("A", OLD_FW, NEW), "the old chain booted the new root filesystem"
    orin.start_k3s()
    gate = orin.gate()
    assert gate.returncode == KILLED, describe(gate)
    reason = board.gate_result()["reason"]
    assert "boot chain A runs root filesystem slot B" in reason, reason
    assert board.state()["committed"] == [] and board.mender_calls("commit") == 0


def test_status_shows_the_tegra_slots(orin_agent: Orin) -> None:
    orin = orin_agent
    orin.install()
    result = run_agent(orin.env(), "status", "--version", "1.1.0")
    assert result.returncode == 0, describe(result)
    report = json.loads(result.stdout)
    assert report["backend"] == "mender-tegra" and report["pending"] is True
    slots = report["slots"]
    assert slots["rootfs_slot"] == "A" and slots["boot_chain"] == "A" and slots["pending_target"] == "B"
    assert slots["capsule_staged"] == "yes" and slots["rootfs_slot_B_retry_count"] == "1"
    assert report["next_step"]["step"] == "reboot"


@pytest.mark.parametrize(("missing", "named"), [
    ("nvbootctrl", "nvbootctrl is not installed"),
    ("module", "tegra-rootfs-image update module"),
])
def test_an_orin_image_missing_its_tegra_tools_is_refused(orin_agent: Orin, missing: str, named: str) -> None:
    orin = orin_agent
    if missing == "module":
        Path(orin.board.paths["module"]).unlink()
    else:
        (orin.board.bin / missing).unlink()
    orin.board.publish(URL, NEW, firmware=NEW_FW)
    for command in (("upgrade", "--version", "1.1.0", "--artifact-url", URL), ("gate",)):
        result = run_agent(orin.env(), *command)
        assert result.returncode == 6 and named in result.stderr and "mender-tegra" in result.stderr, describe(result)
    assert orin.board.mender_calls("install") == 0 and orin.board.marker() is None


def test_nvbootctrl_slot_dumps_are_read_as_l4t_prints_them() -> None:
    rootfs = ("Current rootfs slot: B\nActive rootfs slot: B\nnum_slots: 2\n"
              "slot: 0,             retry_count: 0,             status: unbootable\n"
              "slot: 1,             retry_count: 3,             status: normal\n")
    info = parse_slots_info(rootfs)
    assert info["current_rootfs_slot"] == "B" and info["slot_A_status"] == "unbootable"
    assert info["slot_A_retry_count"] == "0" and info["slot_B_retry_count"] == "3"
    bootloader = parse_slots_info("Current version: 35.4.1\nCapsule update status: 0\nCurrent bootloader slot: A\n"
                                  "Active bootloader slot: A\nnum_slots: 2\nslot: 0,             status: normal\n")
    assert bootloader["capsule_update_status"] == "0" and bootloader["active_bootloader_slot"] == "A"
