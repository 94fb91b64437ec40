"""Nodes provisioned the way the docs say, with the layer's real scripts: one root tree per
slot and the shared data partition; gpu-k8s-data keeps the provisioning across the slot
switch, k3s-agent-configured decides whether the agent starts, gpu-k8s-k3s-node-name names
the node. Works with the U-Boot/GRUB board (fake_board.Board) and the Tegra one
(fake_tegra.TegraBoard)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from fake_board import REPO_ROOT, HealthServer, SimulatedNode

LAYER = REPO_ROOT / "meta-gpu-k8s"
DATA_FILES = LAYER / "recipes-core/gpu-k8s-data/files"
K3S_CONFIG_FILES = LAYER / "recipes-containers/gpu-k8s-k3s-config/files"
AGENT_CONFIGURED = LAYER / "recipes-containers/k3s/files/k3s-agent-configured"
SERIAL = "1424019123456"
HOSTNAME = "jetson-nano-devkit"


class Disks:
    """One root tree per slot and the shared data partition; each slot tree sees the data
    partition at /data (a link here, a mount on the board)."""

    def __init__(self, board: SimulatedNode, slots: tuple[str, str], hostname: str = HOSTNAME) -> None:
        self.board = board
        self.hostname = hostname
        self.data = board.root / "disk-data"
        self.data.mkdir()
        self.slots = {slots[0]: board.root / "disk-a", slots[1]: board.root / "disk-b"}
        self.mounts = board.root / "mountinfo"
        self.mounts.write_text("20 1 8:1 / / rw - ext4 /dev/x rw\n21 1 8:3 / /data rw - ext4 /dev/y rw\n")
        fake_bin = board.root / "fake-mount-bin"
        fake_bin.mkdir()
        (fake_bin / "mount").write_text("#!/bin/sh\nexit 0\n")
        (fake_bin / "mount").chmod(0o755)
        self.path = f"{fake_bin}:/usr/bin:/bin"
        self.booted = board.booted_slot()

    def active(self) -> Path:
        """The root filesystem of the slot this boot runs (not the one the bootloader will try next)."""
        return self.slots[self.booted]

    def power_cycle(self, node_config_list: Path = DATA_FILES / "node-config.list") -> Any:
        """The board's reset (returns what it returns: the Tegra board's boot log), then
        gpu-k8s-data on the slot that came up."""
        log = self.board.power_cycle()  # type: ignore[attr-defined]
        self.booted = self.board.booted_slot()
        self.data_unit(node_config_list=node_config_list)
        return log

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
        return (f"env GPU_K8S_ROOT={self.active()} GPU_K8S_HOSTNAME={self.hostname} "
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
                   env={"GPU_K8S_ROOT": str(root), "GPU_K8S_NODE_ENV": str(env_file),
                        "GPU_K8S_HOSTNAME": disks.hostname, "PATH": "/usr/bin:/bin"})
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
