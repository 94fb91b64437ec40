"""The shell helpers the k3s units run, executed for real against fixture trees."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from layer_paths import LAYER

K3S_FILES = LAYER / "recipes-containers/k3s/files"
NODE_NAME = LAYER / "recipes-containers/gpu-k8s-k3s-config/files/gpu-k8s-k3s-node-name"
DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def run(script: Path, env: dict[str, str], path_prefix: Path | None = None) -> subprocess.CompletedProcess:
    full = {"PATH": os.environ["PATH"], **env}
    if path_prefix is not None:
        full["PATH"] = f"{path_prefix}:{full['PATH']}"
    return subprocess.run(["/bin/sh", str(script)], env=full, capture_output=True, text=True, timeout=30)


# ---------------------------------------------------------------- k3s-agent-configured


@pytest.fixture
def k3s_config(tmp_path):
    (tmp_path / "config.yaml.d").mkdir()
    return tmp_path


def agent_configured(config_dir: Path, **env: str) -> int:
    return run(K3S_FILES / "k3s-agent-configured", {"K3S_CONFIG_DIR": str(config_dir), **env}).returncode


def test_agent_without_a_server_is_skipped_not_failed(k3s_config):
    (k3s_config / "config.yaml.d/10-gpu-k8s-runtime.yaml").write_text("docker: true\n")
    (k3s_config / "config.yaml").write_text("# server: https://example:6443\n  server: nested\n")
    assert agent_configured(k3s_config) == 1  # 1..254: ExecCondition skips the unit


@pytest.mark.parametrize("where", ["config.yaml", "config.yaml.d/05-join.yaml"])
def test_server_in_any_config_file_is_a_valid_agent_setup(k3s_config, where):
    (k3s_config / where).write_text('server: "https://10.0.0.1:6443"\ntoken-file: /etc/rancher/k3s/token\n')
    assert agent_configured(k3s_config) == 0


def test_server_in_the_environment_is_a_valid_agent_setup(k3s_config):
    assert agent_configured(k3s_config, K3S_URL="https://10.0.0.1:6443") == 0


# ---------------------------------------------------------------- node name


@pytest.fixture
def node(tmp_path):
    root = tmp_path / "root"
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "sys/class/dmi/id").mkdir(parents=True)
    (root / "var/lib").mkdir(parents=True)

    def name(hostname: str = "jetson-nano-devkit") -> str:
        env_file = tmp_path / "run/k3s-node.env"
        result = run(NODE_NAME, {"GPU_K8S_ROOT": str(root), "GPU_K8S_NODE_ENV": str(env_file),
                                 "GPU_K8S_HOSTNAME": hostname})
        assert result.returncode == 0, result.stderr
        line = env_file.read_text().strip()
        assert line.startswith("K3S_NODE_NAME=")
        value = line.split("=", 1)[1]
        assert DNS_LABEL.fullmatch(value), f"{value!r} is not a valid node name"
        return value

    name.root = root
    return name


def test_jetson_name_comes_from_its_serial_number(node):
    (node.root / "proc/device-tree/serial-number").write_bytes(b"1422919012345\x00")
    assert node() == "jetson-nano-devkit-1422919012345"
    assert node() == "jetson-nano-devkit-1422919012345", "same name on every boot"


def test_x86_name_comes_from_the_dmi_uuid(node):
    (node.root / "sys/class/dmi/id/product_uuid").write_text("4C4C4544-0042-3510-8052-B4C04F564433\n")
    assert node("genericx86-64") == "genericx86-64-4c4c4544-0042-3510-8052-b4c04f564433"


@pytest.mark.parametrize("placeholder", ["00000000-0000-0000-0000-000000000000",
                                         "03000200-0400-0500-0006-000700080009"])
def test_without_hardware_id_a_random_id_is_kept_on_the_data_partition(node, placeholder):
    (node.root / "sys/class/dmi/id/product_uuid").write_text(placeholder + "\n")
    (node.root / "proc/device-tree/serial-number").write_bytes(b"0000000000\x00")
    (node.root / "data").mkdir()
    first = node("qemux86-64")
    assert re.fullmatch(r"qemux86-64-[0-9a-f]{8}", first)
    assert (node.root / "data/gpu-k8s/node-id").exists(), "kept where an A/B update does not reach"
    assert node("qemux86-64") == first


def test_two_boards_get_two_names(node, tmp_path):
    (node.root / "proc/device-tree/serial-number").write_bytes(b"1422919012345\x00")
    first = node()
    (node.root / "proc/device-tree/serial-number").write_bytes(b"1422919099999\x00")
    assert node() != first


def test_long_host_names_are_shortened_never_the_unique_part(node):
    (node.root / "sys/class/dmi/id/product_uuid").write_text("4c4c4544-0042-3510-8052-b4c04f564433\n")
    name = node("A" * 80 + ".example.com")
    assert len(name) <= 63 and name.endswith("-4c4c4544-0042-3510-8052-b4c04f564433")


# ---------------------------------------------------------------- airgap images loader


@pytest.fixture
def airgap(tmp_path):
    airgap_dir = tmp_path / "share/k3s/airgap-images"
    airgap_dir.mkdir(parents=True)
    (airgap_dir / "k3s-airgap-images-amd64.tar.zst").write_bytes(b"zstd-data")
    config_dir = tmp_path / "etc/rancher/k3s"
    (config_dir / "config.yaml.d").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for name in ("docker", "zstd"):
        tool = bin_dir / name
        tool.write_text(f"#!{sys.executable}\nimport sys\nopen({str(log)!r}, 'a').write("
                        f"{name!r} + ' ' + ' '.join(sys.argv[1:]) + '\\n')\nsys.stdin.read() if {name!r} == 'docker' "
                        "else None\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    env = {"K3S_AIRGAP_DIR": str(airgap_dir), "K3S_CONFIG_DIR": str(config_dir),
           "K3S_DATA_DIR": str(tmp_path / "var/lib/rancher/k3s"), "GPU_K8S_STATE_DIR": str(tmp_path / "state")}

    def load(mode: str) -> list[str]:
        result = subprocess.run(["/bin/sh", str(K3S_FILES / "k3s-airgap-images-load"), mode],
                                env={**env, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        return log.read_text().splitlines() if log.exists() else []

    load.config_dir, load.tmp = config_dir, tmp_path
    return load


def test_containerd_mode_links_the_tarball_where_k3s_imports_images(airgap):
    link = airgap.tmp / "var/lib/rancher/k3s/agent/images/k3s-airgap-images-amd64.tar.zst"
    assert airgap("docker") == [] and not link.exists(), "the docker unit does nothing here"
    assert airgap("containerd") == [], "k3s imports it itself: no docker"
    assert link.is_symlink() and link.read_bytes() == b"zstd-data"


def test_docker_mode_loads_the_tarball_into_docker_once(airgap):
    (airgap.config_dir / "config.yaml.d/10-gpu-k8s-runtime.yaml").write_text("docker: true\n")
    assert airgap("containerd") == [], "the containerd unit does nothing here"
    assert not (airgap.tmp / "var/lib/rancher/k3s/agent/images").exists()
    calls = airgap("docker")
    assert len(calls) == 2, calls  # one pipeline: the two sides log in either order
    zstd = next(c for c in calls if c.startswith("zstd "))
    assert zstd.startswith("zstd -dc ") and zstd.endswith("k3s-airgap-images-amd64.tar.zst")
    assert "docker load" in calls
    assert airgap("docker") == calls, "loaded once: the second boot does nothing"


def test_airgap_units_one_before_k3s_one_beside_it():
    import configparser

    units = {}
    for name in ("k3s-airgap-images.service", "k3s-airgap-images-docker.service"):
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(K3S_FILES / name)
        units[name] = parser
    link, load = units["k3s-airgap-images.service"], units["k3s-airgap-images-docker.service"]
    assert link["Service"]["ExecStart"].endswith("k3s-airgap-images-load containerd")
    assert {"k3s.service", "k3s-agent.service"} <= set(link["Unit"]["Before"].split())
    assert load["Service"]["ExecStart"].endswith("k3s-airgap-images-load docker")
    assert "Before" not in load["Unit"], "a minutes-long docker load must not hold k3s back"
    assert load["Unit"]["After"] == "docker.service"


def test_airgap_loader_refuses_an_unknown_mode():
    result = subprocess.run(["/bin/sh", str(K3S_FILES / "k3s-airgap-images-load"), "podman"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "usage" in result.stderr
