"""The k3s unit drop-in of the image calls `gpu-device-plugin node-labels` at every k3s start:
run exactly that command line (paths moved into a temporary root) against fixture nodes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from gpu_device_plugin.cli import main as cli

REPO = Path(__file__).resolve().parents[2]
LAYER = REPO / "meta-gpu-k8s"
DROP_IN = LAYER / "recipes-containers/gpu-k8s-k3s-config/files/10-gpu-k8s-node.conf"
PLUGIN_CONFIGS = LAYER / "recipes-plugin/gpu-device-plugin/files"
FIXTURES = Path(__file__).parent / "fixtures"


pytestmark = pytest.mark.usefixtures("no_plugin_env")


def unit_command() -> list[str]:
    """The node-labels ExecStartPre of the drop-in, '-' prefix and binary dropped."""
    lines = re.findall(r"^ExecStartPre=-(\S*gpu-device-plugin .*)$", DROP_IN.read_text(), re.M)
    assert len(lines) == 1, "one node-labels call in the k3s drop-in"
    binary, *argv = shlex.split(lines[0])
    assert binary == "@BINDIR@/gpu-device-plugin"
    return argv


def run_as_the_unit(tmp_path: Path, plugin_config: Path, *extra: str) -> tuple[int, Path]:
    etc = tmp_path / "etc"
    (etc / "rancher/k3s/config.yaml.d").mkdir(parents=True, exist_ok=True)
    argv = [arg.replace("@SYSCONFDIR@/gpu-device-plugin/config.yaml", str(plugin_config))
            .replace("@SYSCONFDIR@", str(etc)) for arg in unit_command()]
    output = Path(argv[argv.index("--output") + 1])
    assert output.parent == etc / "rancher/k3s/config.yaml.d"
    return cli.main([*argv, *extra]), output


def test_jetson_nano_gets_its_gpu_labels_as_a_k3s_drop_in(tmp_path: Path) -> None:
    code, output = run_as_the_unit(tmp_path, PLUGIN_CONFIGS / "tegra/gpu-device-plugin.yaml",
                                   "--host-root", str(FIXTURES / "jetson-nano"))
    assert code == 0
    labels = dict(item.split("=", 1) for item in yaml.safe_load(output.read_text())["node-label+"])
    assert labels["nvidia.com/gpu.present"] == "true" and labels["nvidia.com/gpu.family"] == "maxwell"
    # Sorts after the image's own drop-ins, so its node-label+ adds to GPU_K8S_NODE_LABELS' list.
    assert output.name > "50-gpu-k8s-labels.yaml"


def test_a_node_without_gpu_gets_no_gpu_labels_and_a_stale_drop_in_goes(tmp_path: Path) -> None:
    stale = tmp_path / "etc/rancher/k3s/config.yaml.d/60-gpu-k8s-gpu-labels.yaml"
    stale.parent.mkdir(parents=True)
    stale.write_text("node-label+:\n  - nvidia.com/gpu.present=true\n")
    empty_root = tmp_path / "host"
    empty_root.mkdir()
    code, output = run_as_the_unit(tmp_path, PLUGIN_CONFIGS / "gpu-device-plugin.yaml", "--host-root", str(empty_root))
    assert code == 0
    assert output == stale and not output.exists()
