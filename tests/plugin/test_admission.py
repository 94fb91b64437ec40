"""Pods admitted the way the kubelet's device manager does it, with time-slicing and health."""

from __future__ import annotations

import os

import pytest
from gpu_device_plugin.config.settings import TimeSlicing
from gpu_device_plugin.health.simulated import SimulatedHealthMonitor
from helpers import run_simulated
from kubelet_double import Insufficient, KubeletDouble


def test_one_gpu_with_four_replicas_admits_four_pods_and_refuses_the_fifth(socket_dir: str,
                                                                          kubelet: KubeletDouble) -> None:
    with run_simulated(socket_dir, gpus=1, time_slicing=TimeSlicing(replicas=4)):
        endpoint = kubelet.wait_registered()
        endpoint.wait_for(lambda d: len(d) == 4)
        pods = [endpoint.admit(1) for _ in range(4)]
        assert len({ids[0] for ids, _ in pods}) == 4, "each pod must get its own replica"
        assert {dict(r.envs)["NVIDIA_VISIBLE_DEVICES"] for _, r in pods} == {"sim-gpu-0"}
        with pytest.raises(Insufficient, match="Insufficient nvidia.com/gpu"):
            endpoint.admit(1)
        endpoint.release(pods[0][0])  # the first pod completes
        ids, response = endpoint.admit(1)
        assert ids == pods[0][0] and dict(response.envs)["NVIDIA_VISIBLE_DEVICES"] == "sim-gpu-0"


def test_shared_replicas_are_spread_over_physical_gpus(socket_dir: str, kubelet: KubeletDouble) -> None:
    with run_simulated(socket_dir, gpus=2, time_slicing=TimeSlicing(replicas=2)):
        endpoint = kubelet.wait_registered()
        endpoint.wait_for(lambda d: len(d) == 4)
        first, _ = endpoint.admit(1)
        second, _ = endpoint.admit(1)
        assert first[0].split("::")[0] != second[0].split("::")[0], "second pod should land on the idle GPU"
        pair, response = endpoint.admit(2)
        assert dict(response.envs)["NVIDIA_VISIBLE_DEVICES"] == "sim-gpu-0,sim-gpu-1"
        assert len(pair) == 2


def test_unhealthy_gpu_takes_all_its_replicas_out_of_admission(socket_dir: str, kubelet: KubeletDouble) -> None:
    health_dir = os.path.join(socket_dir, "health")
    monitor = SimulatedHealthMonitor(health_dir)
    with run_simulated(socket_dir, gpus=1, monitor=monitor, simulated_health_dir=health_dir,
                       time_slicing=TimeSlicing(replicas=3)):
        endpoint = kubelet.wait_registered()
        endpoint.wait_for(lambda d: len(d) == 3)
        with open(os.path.join(health_dir, "sim-gpu-0"), "w") as f:
            f.write("Unhealthy: Xid 79\n")
        endpoint.wait_for(lambda d: set(d.values()) == {"Unhealthy"}, timeout=1.0)
        with pytest.raises(Insufficient):
            endpoint.admit(1)
        os.unlink(os.path.join(health_dir, "sim-gpu-0"))
        endpoint.wait_for(lambda d: set(d.values()) == {"Healthy"}, timeout=1.0)
        assert endpoint.admit(1)[0]
