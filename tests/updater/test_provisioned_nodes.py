"""Update cycles of nodes provisioned the way the docs say, with the layer's real scripts:
gpu-k8s-data keeps the provisioning across the slot switch, k3s-agent-configured decides
whether the agent starts, gpu-k8s-k3s-node-name names the node, and the gate must find that
node through the API server (no GPU_K8S_UPDATE_NODE_NAME given)."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from fake_board import REPO_ROOT, SLOT_A, SLOT_B, Board, HealthServer, describe, run_agent

LAYER = REPO_ROOT / "meta-gpu-k8s"
DATA_FILES = LAYER / "recipes-core/gpu-k8s-data/files"
K3S_CONFIG_FILES = LAYER / "recipes-containers/gpu-k8s-k3s-config/files"
AGENT_CONFIGURED = LAYER / "recipes-containers/k3s/files/k3s-agent-configured"
URL = "https://updates.example/1.1.0/gpu-k8s-image-jetson-nano-devkit.mender"
NEW = "gpu-k8s-1.1.0"
SERIAL = "1424019123456"
HOSTNAME = "jetson-nano-devkit"


class Disks:
    """One root tree per slot and the shared data partition; each slot tree sees the data
    partition at /data (a link here, a mount on the board)."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self.data = board.root / "disk-data"
        self.data.mkdir()
        self.slots = {SLOT_A: board.root / "disk-a", SLOT_B: board.root / "disk-b"}
        self.mounts = board.root / "mountinfo"
        self.mounts.write_text("20 1 8:1 / / rw - ext4 /dev/x rw\n21 1 8:3 / /data rw - ext4 /dev/y rw\n")
        fake_bin = board.root / "fake-mount-bin"
        fake_bin.mkdir()
        (fake_bin / "mount").write_text("#!/bin/sh\nexit 0\n")
        (fake_bin / "mount").chmod(0o755)
        self.path = f"{fake_bin}:/usr/bin:/bin"
        self.booted = SLOT_A

    def active(self) -> Path:
        """The root filesystem of the slot this boot runs (not the one the bootloader will try next)."""
        return self.slots[self.booted]

    def power_cycle(self, node_config_list: Path = DATA_FILES / "node-config.list") -> None:
        self.board.power_cycle()
        self.booted = self.board.state()["bootenv"]["mender_boot_part"]
        self.data_unit(node_config_list=node_config_list)

    def write_image(self, slot: str) -> None:
        """What Mender's install does: a fresh root filesystem from the image."""
        root = self.slots[slot]
        shutil.rmtree(root, ignore_errors=True)
        (root / "etc/rancher/k3s/config.yaml.d").mkdir(parents=True)
        (root / "etc/rancher/k3s/config.yaml.d/10-gpu-k8s-runtime.yaml").write_text("docker: true\n")
        (root / "etc/gpu-device-plugin").mkdir(parents=True)
        (root / "etc/gpu-device-plugin/config.yaml").write_text("version: v1\n")
        (root / "proc/device-tree").mkdir(parents=True)
        (root / "proc/device-tree/serial-number").write_bytes(SERIAL.encode() + b"\0")
        (root / "data").symlink_to(self.data)

    def data_unit(self, *args: str, node_config_list: Path = DATA_FILES / "node-config.list") -> None:
        """gpu-k8s-data.service: at boot (no args) or at shutdown (--adopt)."""
        env = {"PATH": self.path, "GPU_K8S_ROOT": str(self.active()), "GPU_K8S_MOUNTINFO": str(self.mounts),
               "GPU_K8S_PERSIST_LIST": str(DATA_FILES / "persist.list"),
               "GPU_K8S_NODE_CONFIG_LIST": str(node_config_list)}
        result = subprocess.run(["sh", str(DATA_FILES / "gpu-k8s-data.sh"), *args], env=env, capture_output=True,
                                text=True, timeout=30, check=False)
        assert result.returncode == 0, result.stderr

    def naming_command(self) -> str:
        return (f"env GPU_K8S_ROOT={self.active()} GPU_K8S_HOSTNAME={HOSTNAME} "
                f"sh {K3S_CONFIG_FILES / 'gpu-k8s-k3s-node-name'}")


def k3s_config(root: Path) -> dict[str, str]:
    """The scalars k3s would read: config.yaml, then config.yaml.d/*.yaml in name order."""
    config_dir = root / "etc/rancher/k3s"
    values: dict[str, str] = {}
    for path in [config_dir / "config.yaml", *sorted((config_dir / "config.yaml.d").glob("*.yaml"))]:
        if path.is_file():
            for line in path.read_text().splitlines():
                key, sep, value = line.partition(":")
                if sep and not key.startswith((" ", "-", "#")):
                    values[key] = value.strip().strip('"')
    return values


def start_k3s(disks: Disks, kubelet: HealthServer, role: str) -> str | None:
    """k3s's unit on the booted slot: the agent's ExecCondition, the node-name ExecStartPre,
    then k3s registering the node (name from config, else K3S_NODE_NAME). Returns the name,
    or None when k3s did not come up (no kubelet, no node)."""
    root = disks.active()
    config_dir = root / "etc/rancher/k3s"
    if role == "agent":
        condition = subprocess.run(["sh", str(AGENT_CONFIGURED)], env={"K3S_CONFIG_DIR": str(config_dir),
                                   "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False)
        config = k3s_config(root)
        token_file = config.get("token-file", "")
        token_ok = bool(token_file) and (root / token_file.lstrip("/")).is_file()
        if condition.returncode != 0 or not token_ok:
            kubelet.set_status(503)
            disks.board.change(node=None)
            return None
    env_file = root / "run/gpu-k8s/k3s-node.env"
    subprocess.run(["sh", str(K3S_CONFIG_FILES / "gpu-k8s-k3s-node-name")], check=True, capture_output=True,
                   env={"GPU_K8S_ROOT": str(root), "GPU_K8S_NODE_ENV": str(env_file), "GPU_K8S_HOSTNAME": HOSTNAME,
                        "PATH": "/usr/bin:/bin"})
    name = k3s_config(root).get("node-name") or env_file.read_text().strip().partition("=")[2]
    kubelet.set_status(200)
    disks.board.set_node(name=name)
    return name


def gate_env(disks: Disks, kubelet: HealthServer) -> dict[str, str]:
    root = disks.active()
    return disks.board.environment(kubelet.url, {
        "GPU_K8S_UPDATE_NODE_NAME": "",  # found as k3s finds it
        "GPU_K8S_UPDATE_K3S_CONFIG_DIR": str(root / "etc/rancher/k3s"),
        "GPU_K8S_UPDATE_NODE_ENV_FILE": str(root / "run/gpu-k8s/k3s-node.env"),
        "GPU_K8S_UPDATE_NODE_NAME_COMMAND": disks.naming_command(),
    })


def provision_agent_as_documented(root: Path) -> None:
    """docs/layer.md, "Joining a cluster", typed on the running board."""
    (root / "etc/rancher/k3s/token").write_text("K10abc::server:secret\n")
    (root / "etc/rancher/k3s/token").chmod(0o600)
    (root / "etc/rancher/k3s/config.yaml").write_text(
        "server: https://k3s-server.lan:6443\ntoken-file: /etc/rancher/k3s/token\n")


def update(disks: Disks, kubelet: HealthServer, role: str) -> subprocess.CompletedProcess[str]:
    board = disks.board
    board.publish(URL, NEW)
    result = run_agent(gate_env(disks, kubelet), "upgrade", "--version", "1.1.0", "--artifact-url", URL)
    assert result.returncode == -signal.SIGKILL, describe(result)
    disks.data_unit("--adopt")  # the reboot stops gpu-k8s-data.service
    disks.write_image(board.state()["bootenv"]["mender_boot_part"])
    disks.power_cycle()
    assert board.running == NEW and board.pending
    start_k3s(disks, kubelet, role)
    return run_agent(gate_env(disks, kubelet), "gate")


@pytest.fixture()
def disks(board: Board) -> Disks:
    disks = Disks(board)
    disks.write_image(SLOT_A)
    disks.data_unit()
    return disks


def test_an_agent_joined_as_documented_updates_and_the_gate_asks_the_cluster_about_it(
        disks: Disks, kubelet: HealthServer) -> None:
    provision_agent_as_documented(disks.active())
    name = start_k3s(disks, kubelet, "agent")
    assert name == f"{HOSTNAME}-{SERIAL}", "k3s's node name comes from the layer's naming script"
    gate = update(disks, kubelet, "agent")
    assert gate.returncode == 0, describe(gate)
    board = disks.board
    assert board.state()["committed"] == [NEW]
    reason = board.gate_result()["reason"]
    assert "node Ready" in reason and "1 nvidia.com/gpu allocatable" in reason, reason
    assert "unreachable" not in reason, "the cluster checks ran; no fallback to local checks"
    asked = [call for call in board.state()["calls"] if call[:1] == ["kubectl"] and "node" in call]
    assert asked and all(name in call for call in asked), "every node lookup used k3s's node name"
    kept = disks.active() / "etc/rancher/k3s/config.yaml"
    assert kept.is_symlink() and "k3s-server.lan" in kept.read_text()


def test_without_kept_provisioning_the_same_agent_would_roll_back(
        disks: Disks, kubelet: HealthServer, tmp_path: Path) -> None:
    """The control: what every agent update did before its provisioning was kept."""
    provision_agent_as_documented(disks.active())
    start_k3s(disks, kubelet, "agent")
    nothing = tmp_path / "empty.list"
    nothing.write_text("")
    disks.board.publish(URL, NEW)
    result = run_agent(gate_env(disks, kubelet), "upgrade", "--version", "1.1.0", "--artifact-url", URL)
    assert result.returncode == -signal.SIGKILL
    disks.write_image(disks.board.state()["bootenv"]["mender_boot_part"])
    disks.power_cycle(node_config_list=nothing)
    assert start_k3s(disks, kubelet, "agent") is None, "no server: the agent is skipped"
    gate = run_agent(gate_env(disks, kubelet), "gate")
    assert gate.returncode == -signal.SIGKILL, "rolled back and rebooted"
    assert disks.board.gate_result()["outcome"] == "rolled-back"


def test_a_server_with_its_own_config_keeps_name_and_labels_across_the_update(
        disks: Disks, kubelet: HealthServer) -> None:
    root = disks.active()
    (root / "etc/rancher/k3s/config.yaml").write_text(
        "node-name: gpu-server-1\nwrite-kubeconfig-mode: \"0640\"\nnode-label:\n  - site=lab-2\n")
    assert start_k3s(disks, kubelet, "server") == "gpu-server-1"
    gate = update(disks, kubelet, "server")
    assert gate.returncode == 0, describe(gate)
    assert disks.board.state()["node"]["metadata"]["name"] == "gpu-server-1", "the same node after the update"
    assert "site=lab-2" in (disks.active() / "etc/rancher/k3s/config.yaml").read_text()
    assert "node Ready" in disks.board.gate_result()["reason"]


def test_a_gate_asking_about_a_node_the_cluster_does_not_know_fails_instead_of_passing_blind(
        disks: Disks, kubelet: HealthServer) -> None:
    """Before, the gate asked for the hostname, got NotFound, took it as an unreachable API
    server and passed on local checks alone."""
    provision_agent_as_documented(disks.active())
    start_k3s(disks, kubelet, "agent")
    disks.board.publish(URL, NEW)
    result = run_agent(gate_env(disks, kubelet), "upgrade", "--version", "1.1.0", "--artifact-url", URL)
    assert result.returncode == -signal.SIGKILL
    disks.data_unit("--adopt")
    disks.write_image(disks.board.state()["bootenv"]["mender_boot_part"])
    disks.power_cycle()
    start_k3s(disks, kubelet, "agent")
    env = {**gate_env(disks, kubelet), "GPU_K8S_UPDATE_NODE_NAME": HOSTNAME}
    gate = run_agent(env, "gate")
    assert gate.returncode == -signal.SIGKILL, describe(gate)
    reason = disks.board.gate_result()["reason"]
    assert f"the API server has no node '{HOSTNAME}'" in reason, reason
