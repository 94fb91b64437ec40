"""The `gpu-device-plugin` command as a person and systemd run it: a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubelet_double import KubeletDouble

SRC = Path(__file__).resolve().parents[2] / "plugin" / "src"
FIXTURES = Path(__file__).parent / "fixtures"


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_leftover_plugins() -> Iterator[None]:
    """A failing test must not leave a plugin process running."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def run_cli(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    for name in ("DEVICE_DISCOVERY_STRATEGY", "CONFIG_FILE", "KUBELET_SOCKET", "SIMULATED_GPUS"):
        if env is None or name not in env:
            full_env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "gpu_device_plugin", *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    _STARTED.append(proc)
    return proc


def test_sigterm_stops_serving_removes_the_socket_and_exits_zero(socket_dir: str) -> None:
    kubelet = KubeletDouble(socket_dir)
    kubelet.start()
    try:
        proc = run_cli("--device-discovery-strategy", "simulated", "--simulated-gpus", "2",
                       "--kubelet-socket", f"{socket_dir}/kubelet.sock")
        kubelet.wait_registered(timeout=10)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        kubelet.stop()
    assert proc.returncode == 0, err
    assert not os.path.exists(f"{socket_dir}/nvidia-gpu.sock")
    for line in ("discovery: simulated", "serving nvidia.com/gpu", "registered nvidia.com/gpu", "stopping"):
        assert line in err


def test_bad_flag_exits_2_with_the_flag_named_and_creates_nothing(socket_dir: str) -> None:
    proc = run_cli("--device-discovery-strategy", "simulated", "--simulated-gpus", "0",
                   "--kubelet-socket", f"{socket_dir}/kubelet.sock")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert "--simulated-gpus must be 1..64" in err
    assert os.listdir(socket_dir) == []


def test_bad_config_file_exits_2_naming_the_field(socket_dir: str, tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("version: v1\nflags:\n  deviceDiscoveryStrategy: magic\n")
    proc = run_cli("--config-file", str(bad), "--kubelet-socket", f"{socket_dir}/kubelet.sock")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert "flags.deviceDiscoveryStrategy must be one of auto, tegra, nvml, simulated" in err


def test_no_gpu_with_fail_on_init_error_exits_one_with_the_reason(socket_dir: str) -> None:
    proc = run_cli("--device-discovery-strategy", "tegra", "--host-root", str(FIXTURES / "raspberry-pi-4"),
                   "--fail-on-init-error", "true", "--kubelet-socket", f"{socket_dir}/kubelet.sock")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert "no Tegra SoC" in err and "--fail-on-init-error is true" in err


def test_no_gpu_by_default_keeps_running_and_registers_nothing(socket_dir: str) -> None:
    proc = run_cli("--device-discovery-strategy", "tegra", "--host-root", str(FIXTURES / "raspberry-pi-4"),
                   "--kubelet-socket", f"{socket_dir}/kubelet.sock")
    try:
        time.sleep(1.5)
        assert proc.poll() is None, "plugin exited on a GPU-less node"
        assert not os.path.exists(f"{socket_dir}/nvidia-gpu.sock")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "running with no devices" in err


def test_discover_explains_what_it_found_on_a_jetson_nano() -> None:
    proc = run_cli("discover", "--device-discovery-strategy", "tegra", "--host-root", str(FIXTURES / "jetson-nano"))
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Tegra X1 (T210) id=tegra-t210-igpu0" in out
    assert "l4t: R32.7.6" in out and "/dev/nvhost-gpu" in out
    assert "resource:  nvidia.com/gpu x 1" in out


def test_discover_json_on_auto_names_both_probes() -> None:
    proc = run_cli("discover", "--json", "--host-root", str(FIXTURES / "jetson-nano"))
    out, err = proc.communicate(timeout=20)
    report = json.loads(out)
    assert report["backend"] == "tegra", report
    assert report["probes"]["tegra"]["usable"] is True
    assert "nvml" in report["probes"]
    assert report["advertised"] == ["tegra-t210-igpu0"]


def test_check_reports_a_bad_config_file_and_still_checks_the_node(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("version: v1\nflags:\n  deviceDiscoveryStrategy: magic\n")
    proc = run_cli("check", "--config-file", str(bad), "--host-root", str(FIXTURES / "raspberry-pi-4"),
                   "--kubelet-socket", f"{tmp_path}/kubelet.sock")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, out + err
    assert "flags.deviceDiscoveryStrategy must be one of" in out
    assert "kubelet socket" in out.lower()


def test_flags_before_a_subcommand_are_kept() -> None:
    from gpu_device_plugin.cli.main import parse_args

    args = parse_args(["--simulated-gpus", "3", "--kubelet-socket", "/x/kubelet.sock", "serve"])
    assert (args.simulated_gpus, args.kubelet_socket) == ("3", "/x/kubelet.sock")
    args = parse_args(["check", "--simulated-gpus", "4"])
    assert args.simulated_gpus == "4"


@pytest.mark.parametrize("command", ["serve", "discover", "check", "node-labels"])
def test_every_subcommand_takes_the_config_flags_after_its_name(command: str) -> None:
    from gpu_device_plugin.cli.main import parse_args

    extra = ["--output", "/tmp/labels.yaml"] if command == "node-labels" else []
    args = parse_args([command, "--device-id-strategy", "index", "--config-file", "/etc/x.yaml", *extra])
    assert (args.command, args.device_id_strategy, args.config_file) == (command, "index", "/etc/x.yaml")


def test_a_flag_value_that_is_a_command_name_changes_nothing() -> None:
    from gpu_device_plugin.cli.main import parse_args

    args = parse_args(["--config-file", "check", "--log-level", "debug"])
    assert (args.command, args.config_file, args.log_level) == (None, "check", "debug")


def test_help_lists_the_flags_at_the_top_and_under_a_subcommand(capsys) -> None:
    from gpu_device_plugin.cli.main import parse_args

    for argv in (["--help"], ["discover", "--help"]):
        with pytest.raises(SystemExit) as stopped:
            parse_args(argv)
        assert stopped.value.code == 0
        assert "--device-discovery-strategy" in capsys.readouterr().out


def test_boolean_flags_work_bare_like_the_official_plugin() -> None:
    from gpu_device_plugin.cli.main import parse_args
    from gpu_device_plugin.config import loader

    args = parse_args(["--pass-device-specs", "--fail-on-init-error", "false"])
    values = loader.parse_flags(args)
    assert values["pass_device_specs"] is True and values["fail_on_init_error"] is False


def test_busy_metrics_port_is_a_clear_start_error(socket_dir: str) -> None:
    import socket as socketlib

    busy = socketlib.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        proc = run_cli("--device-discovery-strategy", "simulated", "--simulated-gpus", "1",
                       "--metrics-address", f"127.0.0.1:{port}", "--kubelet-socket", f"{socket_dir}/kubelet.sock")
        _, err = proc.communicate(timeout=20)
    finally:
        busy.close()
    assert proc.returncode == 2, err
    assert f"cannot serve /metrics on 127.0.0.1:{port}" in err and "Traceback" not in err
    assert not os.path.exists(f"{socket_dir}/nvidia-gpu.sock")


def test_unusable_simulated_health_dir_is_a_clear_start_error(socket_dir: str, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_cli("--device-discovery-strategy", "simulated", "--simulated-gpus", "1",
                   "--simulated-health-dir", str(blocker / "health"), "--kubelet-socket", f"{socket_dir}/kubelet.sock")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert "cannot start health monitoring" in err and "Traceback" not in err


def test_non_utf8_config_file_exits_2_naming_it(socket_dir: str, tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_bytes(b"version: v1\n# caf\xe9\n")
    proc = run_cli("--config-file", str(bad), "--kubelet-socket", f"{socket_dir}/kubelet.sock")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert f"config file {bad}: not UTF-8 text" in err


def test_unusable_kubelet_directory_is_a_clear_start_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_cli("--device-discovery-strategy", "simulated", "--simulated-gpus", "1",
                   "--kubelet-socket", f"{blocker}/device-plugins/kubelet.sock")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert "cannot use the kubelet's socket directory" in err and "Traceback" not in err


def test_socket_path_over_the_unix_limit_exits_2_with_the_reason(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    proc = run_cli("--device-discovery-strategy", "simulated", "--simulated-gpus", "1",
                   "--kubelet-socket", f"{deep}/kubelet.sock")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert "over the Unix limit of 107" in err and "retrying" not in err and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to any directory; the rule is tested in test_socket_check")
def test_unwritable_socket_directory_exits_2_with_the_reason(tmp_path: Path) -> None:
    locked = tmp_path / "device-plugins"
    locked.mkdir(mode=0o500)
    proc = run_cli("--device-discovery-strategy", "simulated", "--simulated-gpus", "1",
                   "--kubelet-socket", f"{locked}/kubelet.sock")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert f"cannot create sockets in {locked}" in err


@pytest.mark.parametrize("command", [("discover",), ("discover", "--json"), ("check",)])
def test_a_reader_that_stops_early_gets_no_traceback(command: tuple[str, ...]) -> None:
    """`gpu-device-plugin discover | head -3`: the pipe closes before everything is printed."""
    proc = run_cli(*command, "--device-discovery-strategy", "tegra", "--host-root", str(FIXTURES / "jetson-nano"))
    proc.stdout.close()  # the reader is gone before the command writes a line
    err = proc.stderr.read()
    proc.wait(timeout=20)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode in (0, 1), "exit as the command would have (check reports findings with 1)"


def test_runtime_config_names_a_malformed_expectation(capsys) -> None:
    from gpu_device_plugin.cli import main as cli

    assert cli.main(["runtime-config", "--expect", "accept-nvidia-visible-devices-as-volume-mounts"]) == 2
    assert "must be KEY=VALUE" in capsys.readouterr().err
