"""`gpu-device-plugin check`: the pure evaluations, and run_checks on fixture trees built from the
Jetson Nano fixture plus the files the image installs (daemon.json, k3s config.yaml, plugin config)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gpu_device_plugin.config.settings import Settings, TimeSlicing
from gpu_device_plugin.doctor import run, runtime
from gpu_device_plugin.doctor.config_file import evaluate_config_file
from gpu_device_plugin.doctor.csv_files import evaluate_csv
from gpu_device_plugin.doctor.gpu import Discovered, evaluate_device_nodes, evaluate_discovery
from gpu_device_plugin.doctor.k3s import K3sConfig, evaluate_k3s, parse_k3s_config
from gpu_device_plugin.doctor.kubelet import evaluate_checkpoint, evaluate_kubelet_socket, evaluate_plugin_socket
from gpu_device_plugin.doctor.report import FAIL, PASS, SKIP, WARN, Check, exit_code, format_report
from gpu_device_plugin.doctor.run import run_checks
from gpu_device_plugin.doctor.runtime import evaluate_containerd, evaluate_docker
from gpu_device_plugin.model import Gpu

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
LAYER = REPO / "meta-gpu-k8s"
TEGRA_DAEMON_JSON = LAYER / "recipes-containers/gpu-k8s-docker-config/files/tegra/daemon.json"
X86_DAEMON_JSON = LAYER / "recipes-containers/gpu-k8s-docker-config/files/daemon.json"
# The image's k3s config is rendered per machine by the recipe's own renderer (stdlib only).
K3S_CONFIG_RENDERER = LAYER / "recipes-containers/gpu-k8s-k3s-config/files/gpu-k8s-k3s-config.py"
TEGRA_PLUGIN_YAML = LAYER / "recipes-plugin/gpu-device-plugin/files/tegra/gpu-device-plugin.yaml"

RUNTIME_DROP_IN = "etc/rancher/k3s/config.yaml.d/10-gpu-k8s-runtime.yaml"


def write_image_k3s_config(root: Path, tegra: bool) -> None:
    """The drop-ins the image installs in /etc/rancher/k3s/config.yaml.d/ (docker mode)."""
    spec = importlib.util.spec_from_file_location("gpu_k8s_k3s_config", K3S_CONFIG_RENDERER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    knobs = module.Knobs(cgroup_driver="cgroupfs", cgroup_v1=True, nvidia_runtime=True, role="agent",
                         kubelet_profile="small-4gb") if tegra else module.Knobs()
    for name, text in module.render(knobs).items():
        write(root, f"/etc/rancher/k3s/config.yaml.d/{name}", text)


SET_DEFAULT_RUNTIME = 'set "default-runtime": "nvidia" in /etc/docker/daemon.json and restart docker'

L4T_CSV = """dev, /dev/nvhost-ctrl
dev, /dev/nvhost-ctrl-gpu
dev, /dev/nvhost-gpu
dev, /dev/nvmap
lib, /usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1
sym, /usr/lib/aarch64-linux-gnu/tegra/libcuda.so
dir, /usr/lib/aarch64-linux-gnu/tegra
"""

CONTAINERD_WITH_NVIDIA = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia".options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""

CONTAINERD_WITHOUT_NVIDIA = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"""


def by_name(checks: list[Check]) -> dict[str, Check]:
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), f"check names repeat: {names}"
    return {c.name: c for c in checks}


def write(root: Path, path: str, text: str, mode: int = 0o644) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)
    return target


def checkpoint_json(registered: dict[str, list[str]], entries: list[dict[str, object]] | None = None) -> str:
    return json.dumps({"Data": {"PodDeviceEntries": entries or [], "RegisteredDevices": registered},
                       "Checksum": 1234})


@dataclass
class Node:
    root: Path
    socket_dir: str
    settings: Settings

    def listen(self, name: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(os.path.join(self.socket_dir, name))
        sock.listen(4)
        self.sockets.append(sock)
        return sock

    def __post_init__(self) -> None:
        self.sockets: list[socket.socket] = []

    def run(self, **overrides: object) -> dict[str, Check]:
        return by_name(run_checks(self.settings._replace(**overrides)))  # type: ignore[arg-type]


@pytest.fixture
def nano(tmp_path: Path, socket_dir: str) -> Iterator[Node]:
    """A Jetson Nano set up as the image sets it up, with the kubelet and our plugin listening."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "jetson-nano", root)
    write(root, "/etc/docker/daemon.json", TEGRA_DAEMON_JSON.read_text())
    write_image_k3s_config(root, tegra=True)
    write(root, "/usr/bin/nvidia-container-runtime", "#!/bin/sh\n", mode=0o755)
    write(root, "/etc/nvidia-container-runtime/host-files-for-container.d/l4t.csv", L4T_CSV)
    write(root, "/etc/nvidia-container-runtime/host-files-for-container.d/cuda.csv",
          "lib, /usr/local/cuda-10.2/lib64/libcudart.so.10.2.89\n")
    config_file = write(tmp_path, "/etc/gpu-device-plugin.yaml", TEGRA_PLUGIN_YAML.read_text())
    settings = Settings(host_root=str(root), kubelet_socket=os.path.join(socket_dir, "kubelet.sock"),
                        device_discovery_strategy="tegra", config_file=str(config_file))
    node = Node(root, socket_dir, settings)
    node.listen("kubelet.sock")
    node.listen("nvidia-gpu.sock")
    Path(socket_dir, "kubelet_internal_checkpoint").write_text(checkpoint_json(
        {"nvidia.com/gpu": ["tegra-t210-igpu0"]},
        [{"PodUID": "pod-1", "ContainerName": "cuda", "ResourceName": "nvidia.com/gpu",
          "DeviceIDs": {"-1": ["tegra-t210-igpu0"]}, "AllocResp": "Cg=="}]))
    try:
        yield node
    finally:
        for sock in node.sockets:
            sock.close()


# -- whole node ------------------------------------------------------------------------------


def test_nano_set_up_as_the_image_does_passes_every_check(nano: Node) -> None:
    checks = run_checks(nano.settings)
    got = by_name(checks)
    # the discrete GPU's driver and the toolkit's CDI spec do not apply to a Nano (toolkit 1.0.5, no CDI)
    nvidia = ("NVIDIA driver", "NVIDIA CDI spec", "NVIDIA data-centre services", "NVIDIA container toolkit")
    assert [got[n].status for n in nvidia] == [SKIP, SKIP, SKIP, SKIP]
    assert got["DRA driver"].status == SKIP  # the image's default: the device plugin hands out the GPU
    failing = [c for c in checks if c.status != PASS and c.name not in nvidia + ("GPU isolation", "DRA driver")]
    assert failing == []
    # the Nano's runtime cannot refuse NVIDIA_VISIBLE_DEVICES: a warning that names the limit, not a failure
    assert got["GPU isolation"].status == WARN and "toolkit 1.0.5" in got["GPU isolation"].detail
    assert exit_code(checks) == 0
    assert list(got) == ["config file", "discovery", "device nodes", "kubelet socket", "plugin socket",
                         "kubelet checkpoint", "k3s config", "DRA driver", "container runtime", "GPU isolation",
                         "runtime CSV files", "NVIDIA driver", "NVIDIA CDI spec", "NVIDIA data-centre services",
                         "NVIDIA container toolkit"]
    assert "Tegra X1 (T210)" in got["discovery"].detail
    assert "nvidia.com/gpu x 1" in got["discovery"].detail
    assert "deviceDiscoveryStrategy" in got["config file"].detail
    assert "docker: true" in got["k3s config"].detail
    assert "default-runtime is nvidia" in got["container runtime"].detail
    assert "2 CSV file(s)" in got["runtime CSV files"].detail
    assert "4 device node(s)" in got["runtime CSV files"].detail
    assert "1 healthy nvidia.com/gpu device(s)" in got["kubelet checkpoint"].detail
    assert "all in use" in got["kubelet checkpoint"].detail
    report = format_report(checks)
    assert report.count("fix:") == 1 and "fix: let only trusted workloads run on this node" in report
    assert "1 warn, 0 fail" in report.splitlines()[-1]


def test_daemon_json_without_default_runtime_fails_with_the_fix(nano: Node) -> None:
    doc = json.loads(TEGRA_DAEMON_JSON.read_text())
    del doc["default-runtime"]
    write(nano.root, "/etc/docker/daemon.json", json.dumps(doc))
    checks = run_checks(nano.settings)
    runtime = by_name(checks)["container runtime"]
    assert runtime.status == FAIL
    assert "no default-runtime" in runtime.detail
    assert runtime.fix == SET_DEFAULT_RUNTIME
    assert exit_code(checks) == 1
    report = format_report(checks)
    assert f"      fix: {SET_DEFAULT_RUNTIME}" in report
    assert "1 fail" in report.splitlines()[-1]


def test_daemon_json_that_is_not_json_fails_naming_the_file_and_the_error(nano: Node) -> None:
    write(nano.root, "/etc/docker/daemon.json", '{\n  "default-runtime": "nvidia",\n  "runtimes": {\n')
    runtime = nano.run()["container runtime"]
    assert runtime.status == FAIL
    assert "/etc/docker/daemon.json is not valid JSON" in runtime.detail
    assert "line 4" in runtime.detail  # where json.loads ran out of input
    assert "/etc/docker/daemon.json" in runtime.fix


def test_daemon_json_missing_while_k3s_uses_docker_fails(nano: Node) -> None:
    (nano.root / "etc/docker/daemon.json").unlink()
    runtime = nano.run()["container runtime"]
    assert runtime.status == FAIL
    assert "Unknown runtime specified nvidia" in runtime.detail
    assert '"default-runtime": "nvidia"' in runtime.fix


def test_nvidia_runtime_binary_missing_fails_naming_the_path(nano: Node) -> None:
    (nano.root / "usr/bin/nvidia-container-runtime").unlink()
    runtime = nano.run()["container runtime"]
    assert runtime.status == FAIL
    assert "/usr/bin/nvidia-container-runtime: does not exist" in runtime.detail
    assert runtime.fix.startswith("install nvidia-container-runtime")


def test_missing_kubelet_socket_fails_and_plugin_socket_warns(nano: Node) -> None:
    elsewhere = tempfile.mkdtemp(prefix="gdp-none-", dir="/tmp")
    try:
        got = nano.run(kubelet_socket=os.path.join(elsewhere, "kubelet.sock"))
    finally:
        shutil.rmtree(elsewhere)
    assert got["kubelet socket"].status == FAIL
    assert "the kubelet is not running or uses another root dir; set --kubelet-socket" in got["kubelet socket"].fix
    assert got["plugin socket"].status == WARN
    assert got["plugin socket"].fix == "is gpu-device-plugin.service running? journalctl -u gpu-device-plugin"
    assert got["kubelet checkpoint"].status == SKIP


def test_stale_kubelet_socket_fails(nano: Node) -> None:
    for sock in nano.sockets:
        sock.close()  # the socket files stay behind with nobody accepting: a stopped kubelet
    got = nano.run()
    assert got["kubelet socket"].status == FAIL
    assert "stale socket" in got["kubelet socket"].detail
    assert got["plugin socket"].status == WARN
    assert "stale socket" in got["plugin socket"].detail


def test_kubelet_socket_path_that_is_a_plain_file_fails(nano: Node, tmp_path: Path) -> None:
    plain = tmp_path / "kubelet.sock"
    plain.write_text("")
    kubelet = nano.run(kubelet_socket=str(plain))["kubelet socket"]
    assert kubelet.status == FAIL
    assert "is not a socket" in kubelet.detail


def test_simulated_node_skips_the_runtime_checks(tmp_path: Path, socket_dir: str) -> None:
    root = tmp_path / "root"
    write(root, "/etc/docker/daemon.json", X86_DAEMON_JSON.read_text())  # no nvidia runtime at all
    write_image_k3s_config(root, tegra=False)
    settings = Settings(host_root=str(root), kubelet_socket=os.path.join(socket_dir, "kubelet.sock"),
                        device_discovery_strategy="simulated", simulated_gpus=2)
    got = by_name(run_checks(settings))
    assert got["discovery"].status == PASS
    assert "found 2 GPU(s)" in got["discovery"].detail
    for name in ("device nodes", "k3s config", "container runtime", "runtime CSV files"):
        assert got[name].status == SKIP, (name, got[name])
    assert "simulated" in got["container runtime"].detail


def test_simulated_node_with_broken_daemon_json_still_fails(tmp_path: Path, socket_dir: str) -> None:
    root = tmp_path / "root"
    write(root, "/etc/docker/daemon.json", "{,}")
    write(root, "/etc/rancher/k3s/config.yaml", "docker: true\n")
    settings = Settings(host_root=str(root), kubelet_socket=os.path.join(socket_dir, "kubelet.sock"),
                        device_discovery_strategy="simulated", simulated_gpus=1)
    assert by_name(run_checks(settings))["container runtime"].status == FAIL


def test_k3s_without_docker_or_default_runtime_warns_with_runtimeclass_fix(nano: Node) -> None:
    (nano.root / RUNTIME_DROP_IN).unlink()  # the image's docker-mode drop-in would win over config.yaml
    write(nano.root, "/etc/rancher/k3s/config.yaml", 'node-label:\n  - "nvidia.com/gpu.present=true"\n')
    write(nano.root, "/var/lib/rancher/k3s/agent/etc/containerd/config.toml", CONTAINERD_WITH_NVIDIA)
    got = nano.run()
    assert got["k3s config"].status == WARN
    assert "runtimeClassName: nvidia" in got["k3s config"].detail
    assert got["k3s config"].fix.startswith("add runtimeClassName: nvidia to GPU pod specs")
    # containerd, not docker, is what runs the pods now
    assert got["container runtime"].status == PASS
    assert "k3s's containerd has an nvidia runtime" in got["container runtime"].detail
    assert exit_code(list(got.values())) == 0


def test_k3s_containerd_without_nvidia_runtime_warns(nano: Node) -> None:
    (nano.root / RUNTIME_DROP_IN).unlink()  # the image's docker-mode drop-in would win over config.yaml
    write(nano.root, "/etc/rancher/k3s/config.yaml", "default-runtime: nvidia\n")
    write(nano.root, "/var/lib/rancher/k3s/agent/etc/containerd/config.toml", CONTAINERD_WITHOUT_NVIDIA)
    got = nano.run()
    assert got["k3s config"].status == PASS
    assert got["container runtime"].status == WARN
    assert "has no nvidia runtime" in got["container runtime"].detail


def test_k3s_dropin_overrides_config_yaml(nano: Node) -> None:
    write(nano.root, "/etc/rancher/k3s/config.yaml.d/50-containerd.yaml", "docker: false\n")
    got = nano.run()
    assert got["k3s config"].status == WARN
    assert "/etc/rancher/k3s/config.yaml.d/50-containerd.yaml" in got["k3s config"].detail
    assert got["container runtime"].status == WARN  # containerd config not generated in this tree
    assert "has not generated" in got["container runtime"].detail


def test_k3s_docker_flag_in_the_unit_counts(nano: Node) -> None:
    write(nano.root, "/etc/rancher/k3s/config.yaml", "write-kubeconfig-mode: '0644'\n")
    write(nano.root, "/etc/systemd/system/k3s.service",
          "[Service]\nExecStart=/usr/local/bin/k3s \\\n    server --docker\n")
    got = nano.run()
    assert got["k3s config"].status == PASS
    assert "/etc/systemd/system/k3s.service" in got["k3s config"].detail
    assert got["container runtime"].status == PASS  # docker's daemon.json is checked again


def test_k3s_config_that_is_not_yaml_fails(nano: Node) -> None:
    write(nano.root, "/etc/rancher/k3s/config.yaml", "docker: [true\n")
    k3s = nano.run()["k3s config"]
    assert k3s.status == FAIL
    assert "/etc/rancher/k3s/config.yaml is not valid YAML" in k3s.detail


def test_csv_files_missing_on_tegra_fails(nano: Node) -> None:
    shutil.rmtree(nano.root / "etc/nvidia-container-runtime")
    checks = run_checks(nano.settings)
    csv = by_name(checks)["runtime CSV files"]
    assert csv.status == FAIL
    assert "no *.csv in /etc/nvidia-container-runtime/host-files-for-container.d" in csv.detail
    assert "l4t.csv" in csv.fix
    assert exit_code(checks) == 1


def test_csv_files_without_device_nodes_warn(nano: Node) -> None:
    (nano.root / "etc/nvidia-container-runtime/host-files-for-container.d/l4t.csv").unlink()
    csv = nano.run()["runtime CSV files"]
    assert csv.status == WARN
    assert "none lists a device node" in csv.detail


def test_device_node_that_does_not_resolve_fails(nano: Node) -> None:
    nvmap = nano.root / "dev/nvmap"
    nvmap.unlink()
    nvmap.symlink_to(nano.root / "dev/gone")  # listed by discovery, but nothing behind it
    nodes = nano.run()["device nodes"]
    assert nodes.status == FAIL
    assert "device node /dev/nvmap is missing" in nodes.detail
    assert "modprobe nvgpu" in nodes.fix


def test_tegra_channel_nodes_are_never_opened(nano: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real_open = os.open

    def spy(path: str, flags: int, *args: int) -> int:
        opened.append(str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", spy)
    assert nano.run()["device nodes"].status == PASS
    dev = [os.path.relpath(p, nano.root) for p in opened if p.startswith(str(nano.root / "dev"))]
    assert sorted(dev) == ["dev/nvhost-ctrl", "dev/nvhost-ctrl-gpu", "dev/nvmap"]


def test_explicit_tegra_strategy_on_a_board_without_tegra_fails_with_the_discovery_error(
        tmp_path: Path, socket_dir: str) -> None:
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "raspberry-pi-4", root)
    settings = Settings(host_root=str(root), kubelet_socket=os.path.join(socket_dir, "kubelet.sock"),
                        device_discovery_strategy="tegra")
    got = by_name(run_checks(settings))
    assert got["discovery"].status == FAIL
    assert "tegra: no Tegra SoC" in got["discovery"].detail
    assert "Insufficient nvidia.com/gpu" in got["discovery"].detail
    assert got["device nodes"].status == SKIP
    # the strategy still says this is meant to be a Jetson: the CSV rule applies
    assert got["runtime CSV files"].status == FAIL


def test_jetson_without_gpu_driver_fails_discovery(tmp_path: Path, socket_dir: str) -> None:
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "jetson-nano-no-nvgpu", root)
    settings = Settings(host_root=str(root), kubelet_socket=os.path.join(socket_dir, "kubelet.sock"),
                        device_discovery_strategy="tegra")
    discovery = by_name(run_checks(settings))["discovery"]
    assert discovery.status == FAIL
    assert "modprobe nvgpu" in discovery.detail


def test_a_check_that_crashes_becomes_a_warning_and_the_others_still_run(
        nano: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(settings: Settings) -> list[tuple[str, str]]:
        raise PermissionError(13, "Permission denied", "/etc/nvidia-container-runtime")

    monkeypatch.setattr(run, "read_csv_files", broken)
    got = nano.run()
    assert got["runtime CSV files"].status == WARN
    assert "Permission denied" in got["runtime CSV files"].detail
    assert got["container runtime"].status == PASS


def test_config_file_with_unsupported_fields_warns(nano: Node, tmp_path: Path) -> None:
    path = write(tmp_path, "/custom.yaml", "version: v1\nflags:\n  migStrategy: none\n  mpsRoot: /run/mps\n")
    config = nano.run(config_file=str(path))["config file"]
    assert config.status == WARN
    assert "flags.mpsRoot" in config.detail


# -- pure evaluations ------------------------------------------------------------------------


def test_discovery_auto_without_a_gpu_only_warns() -> None:
    check = evaluate_discovery(Discovered("auto", None, "no GPU found: tegra: no Tegra SoC; nvml: not installed"))
    assert check.status == WARN
    assert "no GPU found" in check.detail


def test_discovery_auto_that_saw_the_hardware_but_found_nothing_fails() -> None:
    check = evaluate_discovery(Discovered("auto", "tegra", "auto chose tegra: Jetson Nano",
                                          error="tegra: no GPU device node exists: modprobe nvgpu"))
    assert check.status == FAIL
    assert "modprobe nvgpu" in check.detail


def test_discovery_that_returns_no_gpu_without_an_error_fails() -> None:
    check = evaluate_discovery(Discovered("nvml", "nvml", "nvml: chosen by --device-discovery-strategy"))
    assert check.status == FAIL
    assert "nvml: discovery returned no usable GPU" in check.detail


def test_discovery_names_a_renamed_shared_resource() -> None:
    gpu = Gpu("tegra-t210-igpu0", 0, "Tegra X1 (T210)", "tegra")
    check = evaluate_discovery(Discovered("tegra", "tegra", "tegra", (gpu,), resource="nvidia.com/gpu.shared",
                                          advertised=4))
    assert check.status == PASS
    assert "pods must request nvidia.com/gpu.shared" in check.detail


def test_discovery_with_only_mig_gpus_warns() -> None:
    gpu = Gpu("GPU-1", 0, "A100", "nvml", mig_enabled=True)
    check = evaluate_discovery(Discovered("nvml", "nvml", "nvml", (gpu,), advertised=0))
    assert check.status == WARN
    assert "MIG" in check.detail


def test_device_nodes_skip_without_gpu_and_on_simulated() -> None:
    assert evaluate_device_nodes(None, [], []).status == SKIP
    assert evaluate_device_nodes("simulated", [], []).status == SKIP
    failing = evaluate_device_nodes("nvml", ["/dev/nvidia0"], ["device node /dev/nvidia0 is missing"])
    assert failing.status == FAIL
    assert "nvidia-smi" in failing.fix


@pytest.mark.parametrize(
    ("doc", "status", "fix_part"),
    [
        ({"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}, "default-runtime": "nvidia"},
         PASS, ""),
        ({"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}}, FAIL, SET_DEFAULT_RUNTIME),
        ({"default-runtime": "nvidia"}, FAIL, 'add "runtimes"'),
        ({"runtimes": {"nvidia": {}}, "default-runtime": "nvidia"}, FAIL, "set runtimes.nvidia.path"),
        ({}, FAIL, 'add "runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}} and set '
                   '"default-runtime": "nvidia" in /etc/docker/daemon.json and restart docker'),
        ([], FAIL, "make /etc/docker/daemon.json a JSON object"),
    ],
)
def test_docker_rules(doc: object, status: str, fix_part: str) -> None:
    check = evaluate_docker(json.dumps(doc), "tegra", lambda path: None)
    assert check.status == status, check
    assert fix_part in check.fix
    assert (check.fix == "") == (status == PASS)


def test_docker_problems_only_warn_when_no_gpu_was_found() -> None:
    assert evaluate_docker("{}", None, lambda path: None).status == WARN
    assert evaluate_docker("{}", "nvml", lambda path: None).status == FAIL


def test_docker_runtime_path_is_checked_through_the_callback() -> None:
    doc = json.dumps({"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}, "default-runtime": "nvidia"})
    seen: list[str] = []

    def problem(path: str) -> str | None:
        seen.append(path)
        return "not found in /usr/bin"

    check = evaluate_docker(doc, "tegra", problem)
    assert seen == ["nvidia-container-runtime"]
    assert check.status == FAIL
    assert "not found in /usr/bin" in check.detail


def test_relative_runtime_path_is_looked_up_in_path(tmp_path: Path) -> None:
    settings = Settings(host_root=str(tmp_path))
    assert runtime.binary_problem(settings, "nvidia-container-runtime") is not None
    write(tmp_path, "/usr/sbin/nvidia-container-runtime", "#!/bin/sh\n", mode=0o755)
    assert runtime.binary_problem(settings, "nvidia-container-runtime") is None
    write(tmp_path, "/opt/runtime", "#!/bin/sh\n", mode=0o644)
    assert runtime.binary_problem(settings, "/opt/runtime") == "/opt/runtime is not executable"


def test_containerd_default_runtime_is_reported() -> None:
    text = CONTAINERD_WITH_NVIDIA + '[plugins."io.containerd.grpc.v1.cri".containerd]\n'
    text += '  default_runtime_name = "nvidia"\n'
    assert "containerd's default runtime" in evaluate_containerd(text, "tegra").detail
    assert "runtimeClassName" in evaluate_containerd(CONTAINERD_WITH_NVIDIA, "tegra").detail
    assert evaluate_containerd(None, "tegra").status == WARN


def test_k3s_rules() -> None:
    assert evaluate_k3s(K3sConfig(), "tegra").status == SKIP
    docker = parse_k3s_config([("/etc/rancher/k3s/config.yaml", "docker: true\n")])
    assert evaluate_k3s(docker, "tegra").status == PASS
    runtime = parse_k3s_config([("/etc/rancher/k3s/config.yaml", "default-runtime: nvidia\n")])
    assert evaluate_k3s(runtime, "nvml").status == PASS
    other = parse_k3s_config([("/etc/rancher/k3s/config.yaml", "default-runtime: crun\n")])
    check = evaluate_k3s(other, "tegra")
    assert check.status == WARN
    assert "default-runtime crun" in check.detail
    flag = parse_k3s_config([], [("/lib/systemd/system/k3s.service",
                                  "[Service]\nExecStart=/usr/local/bin/k3s agent --default-runtime=nvidia\n")])
    assert flag.default_runtime == "nvidia"
    unit = "ExecStart=/usr/local/bin/k3s server --docker=false\n"
    off = parse_k3s_config([("/etc/rancher/k3s/config.yaml", "docker: true\n")],
                           [("/etc/systemd/system/k3s.service", unit)])
    assert off.docker is False
    quoted = parse_k3s_config([("/etc/rancher/k3s/config.yaml", 'docker: "false"\n')])
    assert quoted.docker is False


def test_csv_rules() -> None:
    assert evaluate_csv("nvml", []).status == SKIP
    assert evaluate_csv(None, []).status == SKIP
    assert evaluate_csv("tegra", []).status == FAIL
    check = evaluate_csv("tegra", [("l4t.csv", L4T_CSV), ("cuda.csv", "lib, /usr/lib/libcudart.so\n# dev, comment\n")])
    assert check.status == PASS
    assert "4 device node(s), 4 libraries" in check.detail


def test_kubelet_socket_states() -> None:
    assert evaluate_kubelet_socket("/k/kubelet.sock", "listening").status == PASS
    assert evaluate_kubelet_socket("/k/kubelet.sock", "unreachable", "Permission denied").status == WARN
    assert evaluate_plugin_socket("/k/nvidia-gpu.sock", "listening", 1).status == PASS
    idle = evaluate_plugin_socket("/k/nvidia-gpu.sock", "missing", 0)
    assert idle.status == WARN
    assert "expected while discovery finds no GPU" in idle.detail


def test_checkpoint_old_list_format_and_other_resources() -> None:
    text = checkpoint_json({"nvidia.com/gpu": ["GPU-a", "GPU-b"], "example.com/fpga": ["f0"]},
                           [{"PodUID": "p1", "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
                             "DeviceIDs": ["GPU-a"]},
                            {"PodUID": "p2", "ContainerName": "c", "ResourceName": "example.com/fpga",
                             "DeviceIDs": {"0": ["f0"]}}])
    check = evaluate_checkpoint("/k/kubelet_internal_checkpoint", text, "nvidia.com/gpu")
    assert check.status == PASS
    assert "2 healthy nvidia.com/gpu device(s)" in check.detail
    assert "1 allocated to 1 container(s) in 1 pod(s)" in check.detail
    assert "all in use" not in check.detail
    assert "other resources: example.com/fpga" in check.detail


@pytest.mark.parametrize(
    ("text", "status", "needle"),
    [
        (None, SKIP, "no /k/kubelet_internal_checkpoint yet"),
        ("{not json", WARN, "is not valid JSON"),
        ('["Data"]', WARN, "no Data object"),
        ('{"Data": {"PodDeviceEntries": null, "RegisteredDevices": null}}', WARN, "no healthy nvidia.com/gpu"),
        (checkpoint_json({"nvidia.com/gpu": []}), WARN, "Insufficient nvidia.com/gpu"),
    ],
)
def test_checkpoint_is_parsed_defensively(text: str | None, status: str, needle: str) -> None:
    check = evaluate_checkpoint("/k/kubelet_internal_checkpoint", text, "nvidia.com/gpu")
    assert check.status == status
    assert needle in check.detail


def test_config_file_rules() -> None:
    assert evaluate_config_file("", None).status == SKIP
    missing = evaluate_config_file("/etc/x.yaml", None, "No such file or directory")
    assert missing.status == FAIL
    assert "No such file or directory" in missing.detail
    bad = evaluate_config_file("/etc/x.yaml", "version: v1\nflags:\n  deviceDiscoveryStrategy: magic\n")
    assert bad.status == FAIL
    assert "flags.deviceDiscoveryStrategy" in bad.detail
    shared = evaluate_config_file("/etc/x.yaml", "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                  "      - name: nvidia.com/gpu\n        replicas: 4\n")
    assert shared.status == PASS
    assert "replicas 4" in shared.detail


def test_resource_rename_moves_the_plugin_socket(nano: Node) -> None:
    shared = TimeSlicing(replicas=2, rename_by_default=True)
    got = nano.run(time_slicing=shared)
    assert got["plugin socket"].status == WARN  # nvidia-gpu.sock listens, nvidia-gpu.shared.sock does not
    assert "nvidia-gpu.shared.sock" in got["plugin socket"].detail
    assert "nvidia.com/gpu.shared x 2" in got["discovery"].detail


def test_report_and_exit_code() -> None:
    checks = [Check("a", PASS, "fine"), Check("b", WARN, "hmm", "do this"), Check("c", SKIP, "n/a", "ignored")]
    assert exit_code(checks) == 0
    report = format_report(checks)
    assert report.splitlines() == [
        "PASS  a: fine",
        "WARN  b: hmm",
        "      fix: do this",
        "SKIP  c: n/a",
        "3 checks: 1 pass, 1 warn, 0 fail, 1 skip; no failures; read the WARN lines if GPU pods still stay Pending",
    ]
    checks.append(Check("d", FAIL, "broken", "repair it"))
    assert exit_code(checks) == 1
    assert "GPU pods will not work until the FAIL lines are fixed" in format_report(checks)


def test_check_rejects_an_unknown_status() -> None:
    with pytest.raises(ValueError, match="pass, warn, fail, skip"):
        Check("x", "ok", "detail")


# -- the DRA driver --------------------------------------------------------------------------


@pytest.fixture
def dra_node(nano: Node) -> Iterator[tuple[Node, Path]]:
    """The Nano as a DRA node: k3s on its containerd (the image's renderer, runtime containerd), a
    kubelet root of its own with the driver's default paths under it."""
    spec = importlib.util.spec_from_file_location("gpu_k8s_k3s_config", K3S_CONFIG_RENDERER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    shutil.rmtree(nano.root / "etc/rancher/k3s/config.yaml.d")
    for name, text in module.render(module.Knobs(runtime="containerd", nvidia_runtime=True)).items():
        write(nano.root, f"/etc/rancher/k3s/config.yaml.d/{name}", text)
    kubelet_root = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    try:
        yield nano, kubelet_root
    finally:
        shutil.rmtree(kubelet_root, ignore_errors=True)


def serve_at(node: Node, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(4)
    node.sockets.append(sock)


def test_the_dra_check_stays_out_of_a_device_plugin_node(nano: Node) -> None:
    got = nano.run()
    assert got["DRA driver"].status == SKIP and "allocationApi is device-plugin" in got["DRA driver"].detail
    assert got["plugin socket"].status == PASS


def test_a_dra_node_reports_the_driver_s_sockets_and_prepared_claims(dra_node: tuple[Node, Path]) -> None:
    node, kubelet_root = dra_node
    settings = dict(kubelet_socket=str(kubelet_root / "device-plugins/kubelet.sock"), allocation_api="dra")
    got = node.run(**settings)
    dra = got["DRA driver"]
    assert dra.status == FAIL and dra.fix == "is gpu-dra-driver.service running? journalctl -u gpu-dra-driver"
    assert f"{kubelet_root}/plugins_registry/gpu.meta-gpu-k8s.io-reg.sock is missing" in dra.detail
    assert f"{kubelet_root}/plugins/gpu.meta-gpu-k8s.io/dra.sock is missing" in dra.detail
    # the device plugin registers nothing on a DRA node: its socket is not a problem there
    assert got["plugin socket"].status == SKIP

    serve_at(node, kubelet_root / "plugins_registry/gpu.meta-gpu-k8s.io-reg.sock")
    serve_at(node, kubelet_root / "plugins/gpu.meta-gpu-k8s.io/dra.sock")
    (kubelet_root / "plugins/gpu.meta-gpu-k8s.io/checkpoint.json").write_text(json.dumps(
        {"version": 1, "claims": {"uid-1": {}, "uid-2": {}}}))
    dra = node.run(**settings)["DRA driver"]
    assert dra.status == PASS and "2 prepared claim(s)" in dra.detail, dra
    both = node.run(**{**settings, "allocation_api": "both"})["DRA driver"]
    assert both.status == PASS and "nvidia.com/gpu requests through DRA" in both.detail

    (kubelet_root / "plugins/gpu.meta-gpu-k8s.io/checkpoint.json").write_text("{not json")
    assert node.run(**settings)["DRA driver"].status == WARN


def test_a_dra_node_whose_k3s_runs_docker_fails_naming_the_runtime_fix(nano: Node) -> None:
    dra = nano.run(allocation_api="dra")["DRA driver"]
    assert dra.status == FAIL and "docker: true" in dra.detail and "cri-dockerd" in dra.detail
    assert 'GPU_K8S_K3S_RUNTIME = "containerd"' in dra.fix
