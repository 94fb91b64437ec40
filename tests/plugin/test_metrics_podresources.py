"""Pod attribution: the kubelet's PodResources List (a grpcio server on a Unix socket here),
read by the plugin without grpcio, mapped to physical GPUs as dcgm-exporter maps them; and a
scrape that never waits on a kubelet that hangs or breaks HTTP/2, serving the last mapping."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from types import SimpleNamespace

import grpc
import pytest
from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.metrics.attribution import Holder, holders_by_gpu, physical_id
from gpu_device_plugin.metrics.collector import GpuLabels, GpuSample
from gpu_device_plugin.metrics.pod_mapping import PodMapping, backoff
from gpu_device_plugin.metrics.podresources import PodResourcesError, list_pods, socket_beside
from gpu_device_plugin.metrics.table import format_table
from gpu_device_plugin.metrics.telemetry import (
    OUR_RESOURCES,
    Telemetry,
    device_plugin_mapper,
    dra_mapper,
    kubelet_holders,
    plugin_mappers,
)
from gpu_device_plugin.model import Gpu
from helpers import short_tempdir, wait_until
from podresources_double import Claim, Container, GoawayKubelet, Pod, PodResourcesDouble

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


class OneGpu:
    name = "one"

    def collect(self) -> list[GpuSample]:
        labels = GpuLabels(gpu="0", uuid=GPU_A, device="nvidia0", model_name="m")
        return [GpuSample(labels, {"DCGM_FI_DEV_GPU_UTIL": 5})]

    def close(self) -> None:
        pass


HELD_A = {GPU_A: [Holder("train-0", "ml", "main")]}
TRAIN = [Pod("train-0", "ml", [Container("main", {"nvidia.com/gpu": [GPU_A]})])]
SERVE = [Pod("serve-1", "web", [Container("model", {"nvidia.com/gpu": [GPU_A]})])]


def test_a_refusing_kubelet_is_logged_once_and_the_metrics_go_on_without_pod_labels(
        pod_resources: PodResourcesDouble, caplog: pytest.LogCaptureFixture) -> None:
    pod_resources.pods = TRAIN
    pod_resources.fail_with = grpc.StatusCode.UNAVAILABLE
    telemetry = Telemetry(lambda: [OneGpu()], [GPU_A], pod_resources.socket_path, max_age=0, node="n", wait=30)
    with caplog.at_level(logging.INFO):
        snapshot = telemetry.snapshot()
        assert snapshot.holders == {} and "UNAVAILABLE" in snapshot.pods_error and snapshot.pods_age is None
        text = telemetry.render()
        plain = f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{GPU_A}",device="nvidia0",modelName="m",Hostname="n"}} 5'
        assert plain in text
        assert 'gpu_device_plugin_pod_resources_up{Hostname="n"} 0' in text
        assert "gpu_device_plugin_pod_labels_age_seconds" not in text  # never had an answer
        # scrapes drive the reads: after the back-off one asks again and fails again
        assert wait_until(lambda: telemetry.snapshot() is not None and pod_resources.calls >= 2)
        pod_resources.fail_with = None
        assert wait_until(lambda: telemetry.snapshot().holders == HELD_A, timeout=30)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("keep the last pod labels" in m for m in messages) == 1  # once per failure, not per read
    assert sum("answers again" in m for m in messages) == 1


def test_scrapes_closer_than_max_age_share_one_read(pod_resources: PodResourcesDouble) -> None:
    now = [100.0]
    telemetry = Telemetry(lambda: [OneGpu()], [GPU_A], pod_resources.socket_path, max_age=1.0, node="n",
                          clock=lambda: now[0], wait=30)
    first = telemetry.snapshot()
    now[0] += 0.5
    assert telemetry.snapshot().samples is first.samples and pod_resources.calls == 1
    now[0] += 0.6
    assert telemetry.snapshot().samples is not first.samples and pod_resources.calls == 2


def test_a_hung_kubelet_holds_no_scrape_and_its_last_mapping_is_served_with_its_age(
        pod_resources: PodResourcesDouble) -> None:
    pod_resources.pods = TRAIN
    telemetry = Telemetry(lambda: [OneGpu()], [GPU_A], pod_resources.socket_path, max_age=0, node="n", wait=1.0)
    assert wait_until(lambda: telemetry.snapshot().holders == HELD_A)
    pod_resources.hang()
    assert wait_until(lambda: telemetry.snapshot() is not None and pod_resources.in_list == 1)  # a scrape asked
    # Only now: one List at a time, so no earlier List (one past the gate when hang() came, slow
    # under load) can still answer with this.
    pod_resources.pods = SERVE  # what a fresh answer would say
    for _ in range(20):  # each returns while the kubelet's List is still blocked: no scrape waits on it
        snapshot = telemetry.snapshot()
        text = telemetry.render()
        assert pod_resources.in_list == 1, "a second List started while one hangs"
        assert snapshot.holders == HELD_A  # the last answer, not dropped
        assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in text and 'pod="train-0"' in text
    assert "unanswered" in snapshot.pods_error and snapshot.pods_age is not None
    assert 'gpu_device_plugin_pod_resources_up{Hostname="n"} 0' in text
    assert "gpu_device_plugin_pod_labels_age_seconds{Hostname=\"n\"} " in text
    pod_resources.release()
    assert wait_until(lambda: telemetry.snapshot().holders == {GPU_A: [Holder("serve-1", "web", "model")]})
    assert 'gpu_device_plugin_pod_resources_up{Hostname="n"} 1' in telemetry.render()


def test_a_malformed_goaway_from_the_kubelet_keeps_the_gpu_series_and_the_last_pod_labels(
        pod_resources: PodResourcesDouble) -> None:
    pod_resources.pods = TRAIN
    telemetry = Telemetry(lambda: [OneGpu()], [GPU_A], pod_resources.socket_path, max_age=0, node="n", wait=30)
    assert telemetry.snapshot().holders == HELD_A
    pod_resources.stop()
    broken = GoawayKubelet(pod_resources.socket_path).start()
    try:
        with pytest.raises(PodResourcesError, match=r"INTERNAL: the server broke HTTP/2: a GOAWAY of 3 bytes"):
            list_pods(broken.socket_path)
        assert wait_until(lambda: "GOAWAY of 3 bytes" in telemetry.snapshot().pods_error)
        text = telemetry.render()
    finally:
        broken.stop()
    assert ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="' + GPU_A + '",device="nvidia0",modelName="m",Hostname="n",'
            'container="main",namespace="ml",pod="train-0"} 5') in text
    assert 'gpu_device_plugin_pod_resources_up{Hostname="n"} 0' in text


def test_failed_reads_back_off_doubling_to_a_minute_and_a_good_one_resets_it() -> None:
    assert [backoff(n) for n in (1, 2, 3, 4, 7, 8, 30)] == [1, 2, 4, 8, 60, 60, 60]
    now = [0.0]
    calls: list[float] = []
    answer: list[object] = [OSError("kubelet gone")]

    def read() -> dict:
        calls.append(now[0])
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]  # type: ignore[return-value]

    mapping = PodMapping(read, max_age=0, wait=30, clock=lambda: now[0])
    # (scrape time, reads by then): failures at 0, 1.1, 3.2 wait 1, 2, 4 s before the next read
    for when, reads in ((0.0, 1), (0.5, 1), (1.1, 2), (3.0, 2), (3.2, 3), (7.1, 3), (7.3, 4)):
        now[0] = when
        view = mapping.view()
        assert wait_until(lambda: not mapping.reading), when
        assert len(calls) == reads, (when, calls)
        assert view.holders == {}
    assert mapping.view().error == "kubelet gone" and mapping.failures == 4
    answer[0] = HELD_A
    now[0] = 7.3 + 8
    mapping.view()
    assert wait_until(lambda: not mapping.reading)
    view = mapping.view()
    assert view.holders == HELD_A and view.error == "" and mapping.failures == 0


def test_the_metrics_command_says_how_old_its_pod_labels_are() -> None:
    sample = OneGpu().collect()[0]
    table = format_table([sample], HELD_A, "n", "UNAVAILABLE: refused", 42.4)
    assert "  held by: ml/train-0 (main)" in table
    assert ("pod labels: the kubelet's answer of 42 s ago (the kubelet did not answer now: UNAVAILABLE: refused)"
            in table)


def test_one_list_feeds_every_source_of_holders_merged_as_a_dra_driver_will_plug_in(
        pod_resources: PodResourcesDouble) -> None:
    """A second mapper over the same List (here: a stand-in for claims, by pod name) merges with the
    device plugin's devices; its extra labels reach the series and the shares."""
    pod_resources.pods = [*TRAIN, Pod("claimed", "ml", [Container("main", {})])]

    def claims(pods: list) -> dict[str, list[Holder]]:
        return {GPU_A: [Holder(p.name, p.namespace, c.name, extra=(("dra_claim_name", "gpu-claim"),))
                        for p in pods if p.name == "claimed" for c in p.containers]}

    def read() -> dict:
        return kubelet_holders(pod_resources.socket_path, [device_plugin_mapper(OUR_RESOURCES, [GPU_A]), claims])

    assert read() == {GPU_A: [Holder("train-0", "ml", "main"),
                              Holder("claimed", "ml", "main", extra=(("dra_claim_name", "gpu-claim"),))]}
    assert pod_resources.calls == 1  # one List for both
    telemetry = Telemetry(lambda: [OneGpu()], [GPU_A], None, node="n", wait=30, read_holders=read)
    text = telemetry.render()
    shares = [line for line in text.splitlines() if line.startswith("gpu_device_plugin_pod_gpu_share{")]
    assert [line.split('Hostname="n",', 1)[1] for line in shares] == [
        'container="main",namespace="ml",pod="train-0"} 0.5',
        'container="main",dra_claim_name="gpu-claim",namespace="ml",pod="claimed"} 0.5']
    assert 'modelName="m",Hostname="n"} 5' in text  # two holders: the GPU's series name neither


def _gpu(index: int, uuid: str) -> Gpu:
    return Gpu(id=uuid, index=index, name="g", backend="nvml")


def test_claims_of_our_dra_driver_label_their_gpu_with_the_claim_and_shares_split_a_shared_claim(
        pod_resources: PodResourcesDouble) -> None:
    """PodResources' dynamic_resources, as the kubelet lists a DRA driver's prepared claims: our
    driver's devices (gpu-<index>) map to their GPU with dcgm-exporter's dra_* labels; another
    driver's device of the same name, and a device we do not have, never match."""
    ours = "gpu.meta-gpu-k8s.io"
    pod_resources.pods = [
        Pod("infer-0", "ml", [Container("main", {}, [Claim("shared", ours, "node-1", "gpu-1")])]),
        Pod("infer-1", "ml", [Container("main", {}, [Claim("shared", ours, "node-1", "gpu-1"),
                                                     Claim("nic", "net.example.com", "node-1", "gpu-0")])]),
        Pod("stray", "ml", [Container("main", {}, [Claim("gone", ours, "node-1", "gpu-7")])]),
    ]
    gpus = [_gpu(0, GPU_A), _gpu(1, GPU_B)]
    holders = kubelet_holders(pod_resources.socket_path, [dra_mapper(ours, gpus)])
    labels = (("dra_claim_name", "shared"), ("dra_claim_namespace", "ml"), ("dra_driver_name", ours),
              ("dra_pool_name", "node-1"), ("dra_device_name", "gpu-1"))
    assert holders == {GPU_B: [Holder("infer-0", "ml", "main", extra=labels),
                               Holder("infer-1", "ml", "main", extra=labels)]}

    class GpuB:
        name = "b"

        def collect(self) -> list[GpuSample]:
            return [GpuSample(GpuLabels("1", GPU_B, "nvidia1", "m", "0000:01:00.0"),
                              {"DCGM_FI_DEV_GPU_UTIL": 8.0})]

    telemetry = Telemetry(lambda: [GpuB()], [GPU_B], None, node="n", wait=30,
                          read_holders=lambda: kubelet_holders(pod_resources.socket_path, [dra_mapper(ours, gpus)]))
    shares = [line for line in telemetry.render().splitlines() if line.startswith("gpu_device_plugin_pod_gpu_share{")]
    assert len(shares) == 2 and all(line.endswith("} 0.5") for line in shares), shares
    assert all('dra_claim_name="shared"' in line and 'dra_device_name="gpu-1"' in line for line in shares)


def test_the_node_s_allocation_api_picks_whose_holders_the_metrics_read(pod_resources: PodResourcesDouble) -> None:
    """A node on the device plugin reads nvidia.com/gpu devices; on dra or both, the claims."""
    ours = "gpu.meta-gpu-k8s.io"
    pod_resources.pods = [Pod("a", "ml", [Container("main", {"nvidia.com/gpu": [GPU_A]})]),
                          Pod("b", "ml", [Container("main", {}, [Claim("c", ours, "node-1", "gpu-0")])])]
    gpus = [_gpu(0, GPU_A)]
    for api, pod in (("device-plugin", "a"), ("dra", "b"), ("both", "b")):
        mappers = plugin_mappers(Settings(allocation_api=api), gpus)
        held = kubelet_holders(pod_resources.socket_path, mappers)
        assert [h.pod for h in held[GPU_A]] == [pod], api
