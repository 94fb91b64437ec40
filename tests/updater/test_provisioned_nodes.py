"""Update cycles of nodes provisioned the way the docs say, with the layer's real scripts
(provisioning.py): gpu-k8s-data keeps the provisioning across the slot switch,
k3s-agent-configured decides whether the agent starts, gpu-k8s-k3s-node-name names the node,
and the gate must find that node through the API server (no GPU_K8S_UPDATE_NODE_NAME given)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from fake_board import SLOT_A, SLOT_B, Board, HealthServer, describe, run_agent
from provisioning import HOSTNAME, SERIAL, Disks, gate_env, start_k3s

URL = "https://updates.example/1.1.0/gpu-k8s-image-jetson-nano-devkit.mender"
NEW = "gpu-k8s-1.1.0"


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
    disks.write_image(board.written_slot())
    disks.power_cycle()
    assert board.running == NEW and board.pending
    start_k3s(disks, kubelet, role)
    return run_agent(gate_env(disks, kubelet), "gate")


@pytest.fixture()
def disks(board: Board) -> Disks:
    disks = Disks(board, (SLOT_A, SLOT_B))
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
    disks.write_image(disks.board.written_slot())
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
    disks.write_image(disks.board.written_slot())
    disks.power_cycle()
    start_k3s(disks, kubelet, "agent")
    env = {**gate_env(disks, kubelet), "GPU_K8S_UPDATE_NODE_NAME": HOSTNAME}
    gate = run_agent(env, "gate")
    assert gate.returncode == -signal.SIGKILL, describe(gate)
    reason = disks.board.gate_result()["reason"]
    assert f"the API server has no node '{HOSTNAME}'" in reason, reason
