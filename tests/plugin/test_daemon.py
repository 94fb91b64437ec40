"""The daemon against the kubelet double, over real gRPC on Unix sockets."""

from __future__ import annotations

import os
import time

import grpc
import pytest
from gpu_device_plugin.health.simulated import SimulatedHealthMonitor
from helpers import FEATURES_OFF, remove_watched_tree, run_simulated
from kubelet_double import KubeletDouble


def test_registers_resource_and_streams_every_device_healthy(socket_dir: str, kubelet: KubeletDouble) -> None:
    with run_simulated(socket_dir, gpus=2):
        endpoint = kubelet.wait_registered()
        devices = endpoint.wait_for(lambda d: len(d) == 2)
    assert kubelet.registrations[0][:2] == ("nvidia.com/gpu", "nvidia-gpu.sock")
    assert devices == {"sim-gpu-0": "Healthy", "sim-gpu-1": "Healthy"}
    assert endpoint.options.get_preferred_allocation_available is True
    assert endpoint.options.pre_start_required is False


def test_kubelet_restart_wipes_sockets_and_plugin_registers_again(socket_dir: str, kubelet: KubeletDouble) -> None:
    with run_simulated(socket_dir) as daemon:
        first = kubelet.wait_registered()
        first.wait_for(lambda d: len(d) == 2)
        restarted_at = time.monotonic()
        kubelet.restart()
        second = kubelet.wait_registered(count=2, timeout=3)
        assert second.wait_for(lambda d: len(d) == 2) == {"sim-gpu-0": "Healthy", "sim-gpu-1": "Healthy"}
        assert first.stream_ended.wait(2), "the stream to the old kubelet was not closed"
        assert os.path.exists(os.path.join(socket_dir, "nvidia-gpu.sock"))
        deadline = time.monotonic() + 2
        while daemon.stats.kubelet_restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert daemon.stats.kubelet_restarts == 1
        time.sleep(0.2)
        assert len(kubelet.registrations) == 2, "one kubelet restart must give one re-registration"
    # generous bound for a loaded CI box; bench/ measures the real figure
    assert kubelet.registrations[1][2] - restarted_at < 2.0


def test_deleted_plugin_socket_is_recreated_and_registered_again(socket_dir: str, kubelet: KubeletDouble) -> None:
    with run_simulated(socket_dir):
        kubelet.wait_registered()
        os.unlink(os.path.join(socket_dir, "nvidia-gpu.sock"))
        endpoint = kubelet.wait_registered(count=2, timeout=3)
        assert endpoint.wait_for(lambda d: len(d) == 2)
        assert os.path.exists(os.path.join(socket_dir, "nvidia-gpu.sock"))


def test_waits_for_absent_kubelet_without_retrying_then_registers_when_it_appears(socket_dir: str) -> None:
    with run_simulated(socket_dir) as daemon:
        time.sleep(0.2)
        wakeups = daemon.stats.loop_wakeups
        time.sleep(0.5)
        assert daemon.stats.loop_wakeups == wakeups, "the main loop turned while nothing happened: it polls"
        assert daemon.stats.registration_failures == 0, "plugin tried a kubelet socket that does not exist"
        assert os.path.exists(os.path.join(socket_dir, "nvidia-gpu.sock")), "plugin should serve before registering"
        kubelet = KubeletDouble(socket_dir)
        kubelet.start(cleanup=False)
        try:
            endpoint = kubelet.wait_registered(timeout=3)
            assert len(endpoint.wait_for(lambda d: len(d) == 2)) == 2
            assert daemon.stats.kubelet_restarts == 0, "the kubelet's first appearance is not a restart"
        finally:
            kubelet.stop()


def test_registration_refused_is_retried_with_backoff(socket_dir: str, kubelet: KubeletDouble) -> None:
    kubelet.reject_with = grpc.StatusCode.UNAVAILABLE
    with run_simulated(socket_dir) as daemon:
        time.sleep(1.0)
        failures = daemon.stats.registration_failures
        kubelet.reject_with = None
        kubelet.wait_registered(timeout=12)
    # 50 ms doubling: attempts at about 0, 0.05, 0.15, 0.35, 0.75 s; a fixed short delay makes ~20
    assert 3 <= failures <= 6, f"{failures} attempts in 1 s: expected exponential backoff"


def test_allocate_rejects_unknown_and_duplicate_ids_naming_them(socket_dir: str, kubelet: KubeletDouble) -> None:
    with run_simulated(socket_dir):
        endpoint = kubelet.wait_registered()
        with pytest.raises(grpc.RpcError) as unknown:
            endpoint.allocate(["sim-gpu-0", "gpu-nope"])
        assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "gpu-nope" in unknown.value.details()
        with pytest.raises(grpc.RpcError) as dupes:
            endpoint.allocate(["sim-gpu-1", "sim-gpu-1"])
        assert dupes.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sim-gpu-1" in dupes.value.details()
        ok = endpoint.allocate(["sim-gpu-1"], ["sim-gpu-0"])
    assert [dict(r.envs) for r in ok.container_responses] == [
        {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": "sim-gpu-1"},
        {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": "sim-gpu-0"}]


def test_allocate_returns_cdi_names_and_device_specs_when_configured(socket_dir: str, kubelet: KubeletDouble) -> None:
    with run_simulated(socket_dir, device_list_strategy=("envvar", "cdi-cri"), device_id_strategy="index"):
        endpoint = kubelet.wait_registered()
        response = endpoint.allocate(["sim-gpu-1"]).container_responses[0]
    assert dict(response.envs) == {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": "1"}
    assert [d.name for d in response.cdi_devices] == ["meta-gpu-k8s.io/gpu=1"]


def test_preferred_allocation_honours_must_include_and_size(socket_dir: str, kubelet: KubeletDouble) -> None:
    with run_simulated(socket_dir, gpus=4):
        endpoint = kubelet.wait_registered()
        chosen = endpoint.preferred(["sim-gpu-0", "sim-gpu-1", "sim-gpu-2", "sim-gpu-3"], ["sim-gpu-2"], 2)
    assert len(chosen) == 2 and "sim-gpu-2" in chosen


def test_health_flip_reaches_the_kubelet_and_recovers(socket_dir: str, kubelet: KubeletDouble) -> None:
    health_dir = os.path.join(socket_dir, "health")
    monitor = SimulatedHealthMonitor(health_dir)
    with run_simulated(socket_dir, monitor=monitor, simulated_health_dir=health_dir):
        endpoint = kubelet.wait_registered()
        endpoint.wait_for(lambda d: len(d) == 2)
        with open(os.path.join(health_dir, "sim-gpu-1"), "w") as f:
            f.write("Unhealthy\n")
        assert endpoint.wait_for(lambda d: d.get("sim-gpu-1") == "Unhealthy", timeout=1.0)["sim-gpu-0"] == "Healthy"
        os.unlink(os.path.join(health_dir, "sim-gpu-1"))
        assert endpoint.wait_for(lambda d: d.get("sim-gpu-1") == "Healthy", timeout=1.0)


def test_no_gpus_means_no_registration_but_the_daemon_keeps_running(socket_dir: str, kubelet: KubeletDouble) -> None:
    from gpu_device_plugin.session.daemon import Daemon
    from helpers import RunningDaemon, simulated_settings

    daemon = Daemon(simulated_settings(socket_dir), [], None, environ={})
    with RunningDaemon(daemon) as running:
        time.sleep(0.3)
        assert kubelet.registrations == []
        assert not os.path.exists(os.path.join(socket_dir, "nvidia-gpu.sock"))
        kubelet.restart()  # must not make a GPU-less plugin register either
        time.sleep(0.3)
        assert kubelet.registrations == []
        assert running.stats.kubelet_restarts == 0


def test_stop_removes_socket_and_returns_zero(socket_dir: str, kubelet: KubeletDouble) -> None:
    runner = run_simulated(socket_dir)
    with runner:
        kubelet.wait_registered()
    assert runner.result == [0]
    assert not os.path.exists(os.path.join(socket_dir, "nvidia-gpu.sock"))


def test_cdi_spec_names_what_allocate_returns_and_outlives_a_stop(socket_dir: str, kubelet: KubeletDouble) -> None:
    import json

    spec_dir = os.path.join(socket_dir, "cdi")
    with run_simulated(socket_dir, device_list_strategy=("cdi-cri",), cdi_spec_dir=spec_dir):
        endpoint = kubelet.wait_registered()
        [spec_file] = os.listdir(spec_dir)
        with open(os.path.join(spec_dir, spec_file)) as f:
            spec = json.load(f)
        names = {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
        response = endpoint.allocate(["sim-gpu-1"]).container_responses[0]
        assert [d.name for d in response.cdi_devices] == ["meta-gpu-k8s.io/gpu=sim-gpu-1"]
        assert {d.name for d in response.cdi_devices} <= names
        assert dict(response.envs) == FEATURES_OFF, "CDI-only strategies pass no device list in the environment"
    # the kubelet re-uses CDI names when a container restarts, plugin running or not
    assert os.listdir(spec_dir) == [spec_file], "the spec must survive a plugin restart"


def test_socket_directory_removed_is_recreated_and_registration_restored(socket_dir: str) -> None:
    plugin_dir = os.path.join(socket_dir, "device-plugins")
    os.makedirs(plugin_dir)
    kubelet = KubeletDouble(plugin_dir)
    kubelet.start()
    try:
        with run_simulated(plugin_dir):
            kubelet.wait_registered()
            kubelet.stop()
            remove_watched_tree(plugin_dir)  # e.g. a node reset wiping /var/lib/kubelet
            # liveness bounds, not timings: a loaded CI host took more than 3 s here
            deadline = time.monotonic() + 30
            while not os.path.exists(os.path.join(plugin_dir, "nvidia-gpu.sock")) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert os.path.exists(os.path.join(plugin_dir, "nvidia-gpu.sock")), "plugin did not serve again"
            kubelet.start(cleanup=False)
            endpoint = kubelet.wait_registered(count=2, timeout=30)
            assert len(endpoint.wait_for(lambda d: len(d) == 2)) == 2
    finally:
        kubelet.stop()


def test_socket_loss_is_seen_when_the_config_file_shares_the_socket_directory(socket_dir: str,
                                                                             kubelet: KubeletDouble) -> None:
    import argparse

    from gpu_device_plugin.config import loader
    from gpu_device_plugin.config.settings import Settings
    from gpu_device_plugin.discovery.simulated import SimulatedBackend
    from gpu_device_plugin.session.daemon import Daemon
    from helpers import RunningDaemon

    path = os.path.join(socket_dir, "config.yaml")
    with open(path, "w") as f:
        f.write(f"version: v1\nflags:\n  deviceDiscoveryStrategy: simulated\n  plugin:\n    simulatedGpus: 2\n"
                f"    kubeletSocket: {socket_dir}/kubelet.sock\n")
    namespace = argparse.Namespace(config_file=path, **{o.attr: None for o in loader.OPTIONS})

    def load() -> Settings:
        return loader.load(namespace, {}, lambda p: open(p).read())[0]

    with RunningDaemon(Daemon(load(), SimulatedBackend(2).discover(), None, reload_settings=load, environ={})):
        kubelet.wait_registered()
        os.unlink(os.path.join(socket_dir, "nvidia-gpu.sock"))
        kubelet.wait_registered(count=2, timeout=3)
