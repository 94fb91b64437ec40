"""`gpu-device-plugin dra` as the Go harness and the systemd unit start it: a process given a
kubeconfig, the plugin watcher's directory, a plugin dir, a CDI dir, a state dir and a node name;
SIGTERM ends it with status 0 and its sockets gone. And the per-node choice of API: the driver
publishes nothing where the device plugin serves, the device plugin registers nothing where DRA does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from dra_helpers import DRIVER, NODE, Dirs, KubeletSide, driver_env
from gpu_device_plugin.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]


def driver_command(dirs: Dirs, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gpu_device_plugin", "dra", "--kubeconfig", dirs.kubeconfig,
            "--plugins-registry-dir", dirs.registry, "--plugin-dir", dirs.plugin, "--cdi-dir", dirs.cdi,
            "--state-dir", dirs.state, "--node-name", NODE, "--device-discovery-strategy", "simulated",
            "--simulated-gpus", "2", *extra]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME", "ALLOCATION_API", "CDI_DIR")}
    return {**env, "PYTHONPATH": str(ROOT / "plugin" / "src")}


def wait_for_socket(path: str, process: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert process.poll() is None, f"the driver exited: {process.communicate()[1]}"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)  # polling a file another process creates; no event to wait on here


def test_the_driver_process_publishes_registers_and_stops_cleanly_on_sigterm() -> None:
    with driver_env() as (api, dirs):
        api.kubeconfig(dirs.kubeconfig)
        process = subprocess.Popen(driver_command(dirs), env=environment(), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        try:
            registration = os.path.join(dirs.registry, f"{DRIVER}-reg.sock")
            wait_for_socket(registration, process)
            kubelet = KubeletSide(registration)
            try:
                assert kubelet.get_info().endpoint == os.path.join(dirs.plugin, "dra.sock")
            finally:
                kubelet.close()
            api.wait_for(lambda a: set(a.devices()) == {"gpu-0", "gpu-1"}, timeout=20)
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert process.returncode == 0, err
        assert not os.path.exists(registration) and not os.path.exists(os.path.join(dirs.plugin, "dra.sock"))


def test_where_the_device_plugin_serves_the_driver_publishes_nothing_and_exits(no_plugin_env: None) -> None:
    with driver_env() as (api, dirs):
        api.kubeconfig(dirs.kubeconfig)
        done = subprocess.run(driver_command(dirs, "--allocation-api", "device-plugin"), env=environment(),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0
        assert "publishes nothing" in done.stderr
        assert api.requests == [] and not os.path.exists(dirs.registry)


def test_a_setting_that_can_never_work_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        no_plugin_env: None) -> None:
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    code = cli_main.main(["dra", "--device-discovery-strategy", "simulated", "--simulated-gpus", "1",
                          "--kubeconfig", str(tmp_path / "kubeconfig"), "--node-name", "n"])
    assert code == 2
    assert "has no current-context" in capsys.readouterr().err
    assert cli_main.main(["dra", "--driver-name", "gpu.nvidia.com"]) == 2
    assert "NVIDIA's DRA driver's name" in capsys.readouterr().err


def test_where_dra_serves_the_device_plugin_registers_nothing(kubelet, socket_dir: str) -> None:
    process = subprocess.Popen([sys.executable, "-m", "gpu_device_plugin", "--kubelet-socket",
                                f"{socket_dir}/kubelet.sock", "--device-discovery-strategy", "simulated",
                                "--simulated-gpus", "2", "--allocation-api", "both"],
                               env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        err = ""
        while "no GPUs to advertise" not in err:  # logged once the daemon runs, its SIGTERM handler in place
            assert time.monotonic() < deadline and process.poll() is None, err
            err += process.stderr.readline()
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert "registering nothing as nvidia.com/gpu" in err
    assert kubelet.registrations == [], "one GPU through two APIs: the device plugin must stay out"


def test_on_a_docker_mode_node_the_driver_refuses_since_claims_would_start_without_their_gpu(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_plugin_env: None) -> None:
    config = tmp_path / "etc/rancher/k3s/config.yaml.d"
    config.mkdir(parents=True)
    (config / "10-gpu-k8s-runtime.yaml").write_text("docker: true\n")
    code = cli_main.main(["dra", "--host-root", str(tmp_path), "--device-discovery-strategy", "simulated",
                          "--simulated-gpus", "1", "--kubeconfig", str(tmp_path / "kc"), "--node-name", "n"])
    assert code == 2
    err = capsys.readouterr().err
    assert "cri-dockerd does not pass a claim's CDI devices" in err and "GPU_K8S_K3S_RUNTIME" in err
    (config / "10-gpu-k8s-runtime.yaml").write_text("docker: false\n")
    (tmp_path / "kc").write_text("{")
    cli_main.main(["dra", "--host-root", str(tmp_path), "--device-discovery-strategy", "simulated",
                   "--simulated-gpus", "1", "--kubeconfig", str(tmp_path / "kc"), "--node-name", "n"])
    assert "is not valid YAML" in capsys.readouterr().err  # past the runtime check


def test_a_node_not_yet_joined_waits_for_its_kubeconfig(tmp_path: Path) -> None:
    from gpu_device_plugin.cli import dra as dra_cli

    path = tmp_path / "kubelet.kubeconfig"
    waiter = threading.Thread(target=dra_cli.wait_for_kubeconfig, args=(str(path), 0.01))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive(), "it must wait, not exit (systemd gives up after five quick restarts)"
    path.write_text("written by k3s at join")
    waiter.join(5)
    assert not waiter.is_alive()
