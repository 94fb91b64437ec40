"""Pod attribution: the kubelet's PodResources List (a grpcio server on a Unix socket here),
read by the plugin without grpcio, mapped to physical GPUs as dcgm-exporter maps them."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from types import SimpleNamespace

import grpc
import pytest
from gpu_device_plugin.metrics.attribution import Holder, describe, holders_by_gpu, physical_id
from gpu_device_plugin.metrics.collector import GpuLabels, GpuSample
from gpu_device_plugin.metrics.podresources import PodResourcesError, list_pods, socket_beside
from gpu_device_plugin.metrics.telemetry import OUR_RESOURCES, Telemetry
from helpers import short_tempdir
from podresources_double import Container, Pod, PodResourcesDouble

GPU_A, GPU_B = "GPU-aaaaaaaa-1111-2222-3333-444444444444", "GPU-bbbbbbbb-1111-2222-3333-444444444444"


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pod_resources(kubelet_root: str) -> Iterator[PodResourcesDouble]:
    double = PodResourcesDouble(os.path.join(kubelet_root, "pod-resources", "kubelet.sock")).start()
    yield double
    double.stop()


def test_the_socket_is_the_kubelets_beside_its_device_plugin_directory() -> None:
    assert socket_beside("/var/lib/kubelet/device-plugins/kubelet.sock") == (
        "/var/lib/kubelet/pod-resources/kubelet.sock")
    assert socket_beside("/srv/k3s/agent/kubelet/device-plugins/kubelet.sock") == (
        "/srv/k3s/agent/kubelet/pod-resources/kubelet.sock")


def test_list_is_read_without_grpcio_and_skips_the_fields_it_does_not_declare(
        pod_resources: PodResourcesDouble) -> None:
    pod_resources.pods = [
        Pod("train-0", "ml", [Container("main", {"nvidia.com/gpu": [GPU_A]}), Container("sidecar", {})]),
        Pod("web", "default", [Container("nginx", {"example.com/fpga": ["fpga-0"]})]),
    ]
    pods = list_pods(pod_resources.socket_path)
    assert pods is not None and [(p.name, p.namespace) for p in pods] == [("train-0", "ml"), ("web", "default")]
    main = pods[0].containers[0]
    assert (main.name, main.devices[0].resource_name, list(main.devices[0].device_ids)) == (
        "main", "nvidia.com/gpu", [GPU_A])
    assert [c.name for c in pods[0].containers] == ["main", "sidecar"] and not pods[0].containers[1].devices


def test_no_kubelet_socket_means_nobody_to_attribute(kubelet_root: str) -> None:
    assert list_pods(os.path.join(kubelet_root, "pod-resources", "kubelet.sock")) is None


def test_a_kubelet_that_refuses_is_an_error_naming_the_socket_and_code(pod_resources: PodResourcesDouble) -> None:
    pod_resources.fail_with = grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(PodResourcesError, match=r"kubelet\.sock: PERMISSION_DENIED: refused by the test"):
        list_pods(pod_resources.socket_path)


def _pod(name: str, namespace: str, *containers: tuple[str, str, list[str]]) -> SimpleNamespace:
    return SimpleNamespace(name=name, namespace=namespace, containers=[
        SimpleNamespace(name=c, devices=[SimpleNamespace(resource_name=r, device_ids=ids)])
        for c, r, ids in containers])


def test_a_whole_gpu_maps_to_its_container_and_another_plugins_devices_never_match() -> None:
    pods = [_pod("train-0", "ml", ("main", "nvidia.com/gpu", [GPU_A])),
            _pod("other", "ml", ("x", "example.com/gpu", [GPU_B])),  # same ID, another resource
            _pod("stale", "ml", ("y", "nvidia.com/gpu", ["GPU-gone"]))]  # not one of our GPUs
    assert holders_by_gpu(pods, OUR_RESOURCES, {GPU_A, GPU_B}) == {GPU_A: [Holder("train-0", "ml", "main")]}


def test_time_sliced_replicas_map_to_their_physical_gpu_one_holder_each() -> None:
    pods = [_pod("a", "ns", ("c1", "nvidia.com/gpu.shared", [f"{GPU_A}::0"])),
            _pod("b", "ns", ("c2", "nvidia.com/gpu.shared", [f"{GPU_A}::3", f"{GPU_B}::1"]))]
    assert holders_by_gpu(pods, OUR_RESOURCES, {GPU_A, GPU_B}) == {
        GPU_A: [Holder("a", "ns", "c1", "0"), Holder("b", "ns", "c2", "3")],
        GPU_B: [Holder("b", "ns", "c2", "1")]}
    assert physical_id(f"{GPU_A}::12") == (GPU_A, "12") and physical_id(GPU_A) == (GPU_A, "")
    assert describe({GPU_A: [Holder("a", "ns", "c1", "0")]}) == {GPU_A: ["ns/a (c1, replica 0)"]}


class OneGpu:
    name = "one"

    def collect(self) -> list[GpuSample]:
        labels = GpuLabels(gpu="0", uuid=GPU_A, device="nvidia0", model_name="m")
        return [GpuSample(labels, {"DCGM_FI_DEV_GPU_UTIL": 5})]

    def close(self) -> None:
        pass


def test_a_refusing_kubelet_is_logged_once_and_the_metrics_go_on_without_pod_labels(
        pod_resources: PodResourcesDouble, caplog: pytest.LogCaptureFixture) -> None:
    pod_resources.pods = [Pod("train-0", "ml", [Container("main", {"nvidia.com/gpu": [GPU_A]})])]
    telemetry = Telemetry(lambda: [OneGpu()], [GPU_A], pod_resources.socket_path, max_age=0, node="n")
    pod_resources.fail_with = grpc.StatusCode.UNAVAILABLE
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            snapshot = telemetry.snapshot()
            assert snapshot.holders == {} and "UNAVAILABLE" in snapshot.pods_error
            assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in telemetry.render()
        pod_resources.fail_with = None
        assert telemetry.snapshot().holders == {GPU_A: [Holder("train-0", "ml", "main")]}
    messages = [r.getMessage() for r in caplog.records]
    assert sum("GPU metrics without pod labels" in m for m in messages) == 1
    assert sum("answers again" in m for m in messages) == 1


def test_scrapes_closer_than_max_age_share_one_read(pod_resources: PodResourcesDouble) -> None:
    now = [100.0]
    telemetry = Telemetry(lambda: [OneGpu()], [GPU_A], pod_resources.socket_path, max_age=1.0, node="n",
                          clock=lambda: now[0])
    first = telemetry.snapshot()
    now[0] += 0.5
    assert telemetry.snapshot() is first and pod_resources.calls == 1
    now[0] += 0.6
    assert telemetry.snapshot() is not first and pod_resources.calls == 2
