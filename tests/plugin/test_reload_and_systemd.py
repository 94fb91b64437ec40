"""Config file changes applied live (or rejected, keeping the last good one); systemd notify."""

from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

from gpu_device_plugin.config import loader
from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.session.daemon import Daemon
from helpers import RunningDaemon, wait_until
from kubelet_double import KubeletDouble

SLICED = """version: v1
flags:
  deviceDiscoveryStrategy: simulated
  plugin:
    simulatedGpus: 2
    kubeletSocket: {socket}
sharing:
  timeSlicing:
    renameByDefault: {rename}
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
"""


def write_config(path: Path, socket_dir: str, replicas: int, rename: str = "false") -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(SLICED.format(socket=f"{socket_dir}/kubelet.sock", replicas=replicas, rename=rename))
    os.replace(tmp, path)  # how editors and ConfigMap updates land


def daemon_from_file(path: Path) -> Daemon:
    namespace = argparse.Namespace(config_file=str(path), **{o.attr: None for o in loader.OPTIONS})

    def reload() -> Settings:
        return loader.load(namespace, {}, lambda p: Path(p).read_text())[0]

    settings = reload()
    return Daemon(settings, SimulatedBackend(2).discover(), None, reload_settings=reload, environ={})


def test_valid_change_is_applied_without_dropping_registration(socket_dir: str, kubelet: KubeletDouble) -> None:
    path = Path(socket_dir) / "config.yaml"
    write_config(path, socket_dir, replicas=2)
    with RunningDaemon(daemon_from_file(path)) as daemon:
        endpoint = kubelet.wait_registered()
        endpoint.wait_for(lambda d: len(d) == 4)
        write_config(path, socket_dir, replicas=3)
        devices = endpoint.wait_for(lambda d: len(d) == 6, timeout=2)
        assert "sim-gpu-1::2" in devices
        assert len(kubelet.registrations) == 1, "an unchanged resource must keep its registration"
        path.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
                        "      replicas: -1\n")
        deadline = time.monotonic() + 2
        while daemon.stats.config_rejections == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert daemon.stats.config_rejections == 1
        assert daemon.settings.time_slicing.replicas == 3, "last good configuration must stay in force"
        assert len(endpoint.devices()) == 6


def test_renamed_resource_registers_under_its_new_name(socket_dir: str, kubelet: KubeletDouble) -> None:
    path = Path(socket_dir) / "config.yaml"
    write_config(path, socket_dir, replicas=2)
    with RunningDaemon(daemon_from_file(path)):
        kubelet.wait_registered()
        write_config(path, socket_dir, replicas=2, rename="true")
        shared = kubelet.wait_registered("nvidia.com/gpu.shared", timeout=3)
        assert len(shared.wait_for(lambda d: len(d) == 4)) == 4
        assert os.path.exists(f"{socket_dir}/nvidia-gpu.shared.sock")
        assert not os.path.exists(f"{socket_dir}/nvidia-gpu.sock")


def test_watchdog_self_check_fails_when_our_grpc_server_is_wedged(socket_dir: str, monkeypatch) -> None:
    import threading

    from gpu_device_plugin.service.servicer import DevicePluginServicer

    wedge = threading.Event()
    original = DevicePluginServicer.GetDevicePluginOptions

    def maybe_wedged(self, request, context):  # after `wedge`, every call hangs, as in a deadlock
        if wedge.is_set():
            time.sleep(1.0)
        return original(self, request, context)

    monkeypatch.setattr(DevicePluginServicer, "GetDevicePluginOptions", maybe_wedged)
    settings = Settings(kubelet_socket=f"{socket_dir}/kubelet.sock", device_discovery_strategy="simulated",
                               simulated_gpus=1)
    daemon = Daemon(settings, SimulatedBackend(1).discover(), None, environ={})
    daemon.self_probe_timeout = 0.3
    kubelet = KubeletDouble(socket_dir)
    kubelet.start()
    try:
        with RunningDaemon(daemon):
            kubelet.wait_registered()
            assert daemon.registered_event.wait(2)
            assert daemon.alive(), "a serving plugin must pass its own check"
            wedge.set()
            assert not daemon.alive(), "a server that does not answer must stop the watchdog pings"
    finally:
        kubelet.stop()


def test_non_utf8_config_change_is_rejected_and_the_daemon_keeps_serving(
    socket_dir: str, kubelet: KubeletDouble
) -> None:
    path = Path(socket_dir) / "config.yaml"
    write_config(path, socket_dir, replicas=2)
    with RunningDaemon(daemon_from_file(path)) as daemon:
        endpoint = kubelet.wait_registered()
        path.write_bytes(path.read_bytes() + "# caf\xe9\n".encode("latin-1"))
        assert wait_until(lambda: daemon.stats.config_rejections == 1)
        assert daemon.settings.time_slicing.replicas == 2
        assert len(endpoint.wait_for(lambda d: len(d) == 4)) == 4


def test_a_file_still_being_written_is_not_applied(socket_dir: str, kubelet: KubeletDouble) -> None:
    path = Path(socket_dir) / "config.yaml"
    write_config(path, socket_dir, replicas=2)
    full = SLICED.format(socket=f"{socket_dir}/kubelet.sock", replicas=3, rename="false")
    with RunningDaemon(daemon_from_file(path)) as daemon:
        endpoint = kubelet.wait_registered()
        path.unlink()
        with open(path, "w") as f:  # re-created, written in two parts
            f.write(full[: full.index("sharing:")])
            f.flush()
            time.sleep(0.3)
            assert daemon.stats.config_reloads == 0, "a half-written file was applied"
            f.write(full[full.index("sharing:"):])
        assert len(endpoint.wait_for(lambda d: len(d) == 6, timeout=2)) == 6
        assert daemon.stats.config_reloads == 1


def test_configmap_style_symlink_swap_is_applied(socket_dir: str, kubelet: KubeletDouble) -> None:
    config_dir = Path(socket_dir) / "config"
    config_dir.mkdir()
    (config_dir / "..v1").mkdir()
    write_config(config_dir / "..v1" / "config.yaml", socket_dir, replicas=2)
    os.symlink("..v1", config_dir / "..data")
    os.symlink("..data/config.yaml", config_dir / "config.yaml")
    with RunningDaemon(daemon_from_file(config_dir / "config.yaml")):
        endpoint = kubelet.wait_registered()
        endpoint.wait_for(lambda d: len(d) == 4)
        (config_dir / "..v2").mkdir()
        write_config(config_dir / "..v2" / "config.yaml", socket_dir, replicas=3)
        os.symlink("..v2", config_dir / "..data_tmp")
        os.replace(config_dir / "..data_tmp", config_dir / "..data")  # how the kubelet updates a ConfigMap
        assert len(endpoint.wait_for(lambda d: len(d) == 6, timeout=2)) == 6


def test_reload_keeps_restart_only_settings_and_names_them(socket_dir: str, kubelet: KubeletDouble, caplog) -> None:
    path = Path(socket_dir) / "config.yaml"
    write_config(path, socket_dir, replicas=2)
    with RunningDaemon(daemon_from_file(path)) as daemon:
        endpoint = kubelet.wait_registered()
        text = SLICED.format(socket=f"{socket_dir}/kubelet.sock", replicas=3, rename="false")
        text = text.replace("    simulatedGpus: 2\n", "    simulatedGpus: 5\n    metricsAddress: 127.0.0.1:9999\n")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        assert len(endpoint.wait_for(lambda d: len(d) == 6, timeout=2)) == 6  # replicas applied live
        assert daemon.settings.simulated_gpus == 2 and daemon.settings.metrics_address == ""
    assert any("simulated_gpus, metrics_address needs a restart" in r.getMessage() for r in caplog.records)


def test_gpu_less_node_reports_ready_so_boot_is_not_held_up(socket_dir: str) -> None:
    os.makedirs(f"{socket_dir}/systemd")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(f"{socket_dir}/systemd/notify")
    sink.settimeout(3)
    settings = Settings(kubelet_socket=f"{socket_dir}/kubelet.sock")
    try:
        with RunningDaemon(Daemon(settings, [], None, environ={"NOTIFY_SOCKET": f"{socket_dir}/systemd/notify"})):
            message = sink.recv(256).decode()
    finally:
        sink.close()
    assert message.startswith("READY=1") and "no GPUs" in message
