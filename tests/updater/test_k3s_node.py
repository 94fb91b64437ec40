"""The gate names the node as k3s does (updater/src/gpu_k8s_update/k3s_node.py)."""

from __future__ import annotations

from pathlib import Path

from fake_board import REPO_ROOT
from gpu_k8s_update.k3s_node import NamingPaths, k3s_node_name

NAMING_SCRIPT = REPO_ROOT / "meta-gpu-k8s/recipes-containers/gpu-k8s-k3s-config/files/gpu-k8s-k3s-node-name"


def paths(tmp_path: Path, command: tuple[str, ...] = ("false",)) -> NamingPaths:
    config = tmp_path / "etc/rancher/k3s"
    (config / "config.yaml.d").mkdir(parents=True, exist_ok=True)
    return NamingPaths(config_dir=config, node_env=tmp_path / "run/k3s-node.env",
                       default_files=(tmp_path / "default-k3s",), naming_command=command)


def test_node_name_in_config_wins_and_a_later_drop_in_replaces_it(tmp_path: Path) -> None:
    naming = paths(tmp_path)
    (naming.config_dir / "config.yaml").write_text("server: https://s:6443\nnode-name: from-config\n")
    naming.node_env.parent.mkdir(parents=True)
    naming.node_env.write_text("K3S_NODE_NAME=from-hardware\n")
    assert k3s_node_name(naming, "host") == ("from-config", f"node-name in {naming.config_dir}")
    (naming.config_dir / "config.yaml.d/90-local.yaml").write_text("node-name: \"from-dropin\"  \n")
    assert k3s_node_name(naming, "host")[0] == "from-dropin"


def test_the_layers_name_beats_the_default_file_and_the_hostname(tmp_path: Path) -> None:
    naming = paths(tmp_path)
    (tmp_path / "default-k3s").write_text("K3S_NODE_NAME='from-default'\n")
    assert k3s_node_name(naming, "Host")[0] == "from-default"
    naming.node_env.parent.mkdir(parents=True)
    naming.node_env.write_text("K3S_NODE_NAME=from-hardware\n")
    assert k3s_node_name(naming, "Host")[0] == "from-hardware"
    naming.node_env.unlink()
    (tmp_path / "default-k3s").unlink()
    assert k3s_node_name(naming, "Jetson-Nano") == ("jetson-nano", "hostname")


def test_before_k3s_ran_the_gate_runs_the_layers_naming_script(tmp_path: Path) -> None:
    """An x86-64 box: hostname-<DMI product UUID>, as k3s will register it."""
    root = tmp_path / "root"
    (root / "sys/class/dmi/id").mkdir(parents=True)
    (root / "sys/class/dmi/id/product_uuid").write_text("4C4C4544-0042-3510-8052-B4C04F4E3132\n")
    command = ("env", f"GPU_K8S_ROOT={root}", "GPU_K8S_HOSTNAME=gpu-box", "sh", str(NAMING_SCRIPT))
    name, source = k3s_node_name(paths(tmp_path, command), "ignored")
    assert name == "gpu-box-4c4c4544-0042-3510-8052-b4c04f4e3132"
    assert "gpu-k8s-k3s-node-name" in source
