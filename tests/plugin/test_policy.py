"""The decisions the kubelet sees, as plain values: advertising, preference, Allocate."""

from __future__ import annotations

import pytest
from gpu_device_plugin.config.settings import Settings, TimeSlicing
from gpu_device_plugin.core import policy
from gpu_device_plugin.model import Gpu, Health
from helpers import FEATURES_OFF


def gpu(i: int, numa: int | None = None, backend: str = "nvml", mig: bool = False) -> Gpu:
    nodes = (f"/dev/nvidia{i}", "/dev/nvidiactl", "/dev/nvidia-uvm")
    return Gpu(id=f"GPU-{i:04d}", index=i, name="Test GPU", backend=backend, device_nodes=nodes, numa_node=numa,
               mig_enabled=mig)


def sliced(replicas: int, **kw: bool) -> Settings:
    # envvar: the plugin's default ("auto") is decided at start from the node's runtime (cdi.handover)
    return Settings(device_list_strategy=("envvar",), time_slicing=TimeSlicing(replicas=replicas, **kw))


def by_id(gpus: list[Gpu], settings: Settings) -> dict[str, policy.AdvertisedDevice]:
    return {d.id: d for d in policy.advertised_devices(gpus, settings)}


def test_time_slicing_advertises_replicas_with_official_id_format() -> None:
    ids = [d.id for d in policy.advertised_devices([gpu(0), gpu(1)], sliced(3))]
    assert ids == ["GPU-0000::0", "GPU-0000::1", "GPU-0000::2", "GPU-0001::0", "GPU-0001::1", "GPU-0001::2"]


def test_mig_enabled_gpus_are_never_advertised_whole() -> None:
    ids = [d.id for d in policy.advertised_devices([gpu(0, mig=True), gpu(1)], Settings())]
    assert ids == ["GPU-0001"]


def test_rename_by_default_uses_shared_resource_and_socket() -> None:
    assert policy.resource_name(sliced(2, rename_by_default=True)) == "nvidia.com/gpu.shared"
    assert policy.resource_name(sliced(1, rename_by_default=True)) == "nvidia.com/gpu"
    assert policy.socket_name("nvidia.com/gpu") == "nvidia-gpu.sock"
    assert policy.socket_name("nvidia.com/gpu.shared") == "nvidia-gpu.shared.sock"


def test_replicas_follow_their_physical_gpu_health() -> None:
    devices = policy.advertised_devices([gpu(0), gpu(1)], sliced(2))
    states = policy.device_states(devices, {"GPU-0001": Health(False, "Xid 79")})
    assert [(i, h) for i, h, _ in states] == [
        ("GPU-0000::0", True), ("GPU-0000::1", True), ("GPU-0001::0", False), ("GPU-0001::1", False)]


def test_distributed_spreads_a_multi_replica_request_over_distinct_gpus() -> None:
    devices = by_id([gpu(0), gpu(1), gpu(2)], sliced(4))
    chosen = policy.preferred_allocation(list(devices), [], 3, devices, "distributed")
    assert sorted(devices[i].gpu.id for i in chosen) == ["GPU-0000", "GPU-0001", "GPU-0002"]


def test_distributed_prefers_the_least_loaded_gpu() -> None:
    devices = by_id([gpu(0), gpu(1)], sliced(4))
    available = [i for i in devices if i not in ("GPU-0000::0", "GPU-0000::1")]  # two of GPU 0 in use
    chosen = policy.preferred_allocation(available, [], 1, devices, "distributed")
    assert devices[chosen[0]].gpu.id == "GPU-0001"


def test_packed_fills_the_busiest_gpu_first() -> None:
    devices = by_id([gpu(0), gpu(1)], sliced(4))
    available = [i for i in devices if i != "GPU-0001::0"]  # GPU 1 already has a tenant
    chosen = policy.preferred_allocation(available, [], 2, devices, "packed")
    assert {devices[i].gpu.id for i in chosen} == {"GPU-0001"}


def test_must_include_is_kept_and_size_is_honoured() -> None:
    devices = by_id([gpu(i) for i in range(4)], Settings())
    chosen = policy.preferred_allocation(list(devices), ["GPU-0003"], 2, devices, "distributed")
    assert chosen[0] == "GPU-0003" and len(chosen) == 2


def test_whole_gpus_prefer_the_numa_node_of_must_include() -> None:
    devices = by_id([gpu(0, numa=0), gpu(1, numa=1), gpu(2, numa=0), gpu(3, numa=1)], Settings())
    chosen = policy.preferred_allocation(list(devices), ["GPU-0001"], 2, devices, "distributed")
    assert chosen == ["GPU-0001", "GPU-0003"]


def test_whole_gpus_go_to_the_numa_node_that_fits_the_request() -> None:
    devices = by_id([gpu(0, numa=0), gpu(1, numa=0), gpu(2, numa=1), gpu(3, numa=1)], Settings())
    available = ["GPU-0000", "GPU-0002", "GPU-0003"]  # GPU 1 is in use: node 0 has one free
    chosen = policy.preferred_allocation(available, [], 2, devices, "distributed")
    assert sorted(chosen) == ["GPU-0002", "GPU-0003"]


def test_the_smallest_numa_node_that_fits_is_used_first() -> None:
    devices = by_id([gpu(0, numa=0), gpu(1, numa=0), gpu(2, numa=0), gpu(3, numa=1), gpu(4, numa=1)], Settings())
    for name in ("distributed", "packed"):
        chosen = policy.preferred_allocation(list(devices), [], 2, devices, name)
        assert sorted(chosen) == ["GPU-0003", "GPU-0004"], name  # node 0 stays whole for a 3-GPU pod


def test_a_request_no_node_holds_spans_as_few_nodes_as_it_can() -> None:
    assert policy.numa_plan({0: 3, 1: 1, 2: 2}, [], 4) == [((0,), 3), ((1,), 1)]
    assert policy.numa_plan({0: 1, 1: 4}, [0], 3) == [((0,), 1), ((1,), 2)]  # must_include's node first
    assert policy.numa_plan({None: 4}, [], 2) == [((None,), 2)]  # no NUMA information: one group
    assert policy.numa_plan({0: 1}, [], 3) == [((0,), 1)]  # short: give what there is
    assert policy.numa_plan({1: 3}, [1], 2) == [((1,), 2)]  # one node that is also home


def test_packed_numa_and_must_include_together() -> None:
    devices = by_id([gpu(0, numa=0), gpu(1, numa=1), gpu(2, numa=1)], sliced(2))
    chosen = policy.preferred_allocation(list(devices), ["GPU-0001::1"], 3, devices, "packed")
    assert chosen[0] == "GPU-0001::1"
    assert {devices[i].gpu.id for i in chosen} == {"GPU-0001", "GPU-0002"}  # node 1, GPU 1 drained first
    assert "GPU-0001::0" in chosen


@pytest.mark.parametrize("name, per_gpu", [("distributed", [64] * 8), ("packed", [256, 256] + [0] * 6)])
def test_many_replicas_are_spread_or_packed_exactly(name: str, per_gpu: list[int]) -> None:
    devices = by_id([gpu(i) for i in range(8)], sliced(256))
    chosen = policy.preferred_allocation(list(devices), [], 512, devices, name)
    assert len(set(chosen)) == 512
    assert [sum(devices[i].gpu.index == g for i in chosen) for g in range(8)] == per_gpu


def test_preferred_allocation_never_returns_ids_it_was_not_offered() -> None:
    devices = by_id([gpu(0), gpu(1)], Settings())
    assert policy.preferred_allocation(["GPU-0001", "GPU-9999"], [], 2, devices) == ["GPU-0001"]


@pytest.mark.parametrize("name", ["distributed", "packed"])
def test_with_no_choice_every_offered_device_is_preferred(name: str) -> None:
    # a Jetson without sharing offers its one GPU: the answer is that GPU, must-include first
    devices = by_id([gpu(0)], Settings())
    assert policy.preferred_allocation(["GPU-0000"], [], 1, devices, name) == ["GPU-0000"]
    devices = by_id([gpu(0), gpu(1), gpu(2)], Settings())
    chosen = policy.preferred_allocation(["GPU-0000", "GPU-9999", "GPU-0002"], ["GPU-0002"], 2, devices, name)
    assert chosen == ["GPU-0002", "GPU-0000"]


def test_allocate_maps_replicas_back_to_distinct_physical_gpus() -> None:
    devices = by_id([gpu(0), gpu(1)], sliced(4))
    result = policy.allocate(["GPU-0001::3", "GPU-0001::0", "GPU-0000::2"], devices, sliced(4))
    assert result.envs == {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": "GPU-0000,GPU-0001"}


def test_fail_requests_greater_than_one_refuses_multi_replica_requests() -> None:
    settings = sliced(4, fail_requests_greater_than_one=True)
    devices = by_id([gpu(0)], settings)
    with pytest.raises(policy.AllocationError, match="failRequestsGreaterThanOne"):
        policy.allocate(["GPU-0000::0", "GPU-0000::1"], devices, settings)
    assert policy.allocate(["GPU-0000::1"], devices, settings).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0000"


def test_device_specs_are_deduplicated_host_nodes() -> None:
    settings = Settings()._replace(pass_device_specs=True)
    devices = by_id([gpu(0), gpu(1)], settings)
    specs = policy.allocate(["GPU-0000", "GPU-0001"], devices, settings).device_specs
    assert specs == [(p, p, "rw") for p in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1")]


def test_volume_mounts_strategy_hides_ids_from_the_environment() -> None:
    settings = Settings()._replace(device_list_strategy=("volume-mounts",))
    devices = by_id([gpu(0)], settings)
    result = policy.allocate(["GPU-0000"], devices, settings)
    assert result.envs == {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": policy.VOLUME_MOUNT_DIR}
    assert result.mounts == [(f"{policy.VOLUME_MOUNT_DIR}/GPU-0000", "/dev/null", True)]


def test_cdi_only_strategies_skip_env_and_specs() -> None:
    settings = Settings()._replace(device_list_strategy=("cdi-cri", "cdi-annotations"), pass_device_specs=True)
    devices = by_id([gpu(0)], settings)
    result = policy.allocate(["GPU-0000"], devices, settings)
    # only the feature variables: csv mode honours them for CDI-annotated containers too
    assert result.envs == FEATURES_OFF and result.device_specs == []
    # an NVML GPU is named in the NVIDIA Container Toolkit's spec, not in ours
    assert result.cdi_devices == ["nvidia.com/gpu=GPU-0000"]
    [(key, value)] = result.annotations.items()
    assert key.startswith("cdi.k8s.io/gpu-device-plugin_") and value == "nvidia.com/gpu=GPU-0000"


def test_tegra_gpus_go_to_the_runtime_by_index() -> None:
    tegra = Gpu(id="tegra-t210-igpu0", index=0, name="Tegra X1 (T210)", backend="tegra")
    devices = by_id([tegra], Settings())
    settings = Settings(device_list_strategy=("envvar",))
    envs = policy.allocate(["tegra-t210-igpu0"], devices, settings).envs
    assert envs == {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": "0"}


@pytest.mark.parametrize(("ids", "message"), [
    ([], "names no devices"),
    (["GPU-0000", "GPU-7777", "GPU-8888"], "unknown device IDs: GPU-7777, GPU-8888"),
    (["GPU-0000", "GPU-0000"], "more than once: GPU-0000"),
])
def test_bad_allocate_requests_name_the_problem(ids: list[str], message: str) -> None:
    devices = by_id([gpu(0)], Settings())
    with pytest.raises(policy.AllocationError, match=message):
        policy.allocate(ids, devices, Settings())


def test_a_request_naming_thousands_of_unknown_ids_gets_a_short_error() -> None:
    devices = {d.id: d for d in policy.advertised_devices([gpu(0)], Settings())}
    with pytest.raises(policy.AllocationError) as refused:
        policy.allocate([f"nope-{i:05d}" for i in range(20000)], devices, Settings())
    message = str(refused.value)
    assert message.startswith("unknown device IDs: nope-00000, nope-00001") and message.endswith("and 19990 more")
    assert len(message) < 300, "the error rides in gRPC metadata, which has a size limit"


def test_every_answer_says_whether_the_toolkits_feature_devices_are_given() -> None:
    # "enabled" in a GPU container's environment gives it every such node of the host (toolkit
    # internal/modifier/cdi.go); the kubelet puts the plugin's values after the image's, so saying "disabled"
    # overrides an image that enables them
    settings = Settings(device_list_strategy=("volume-mounts",))
    devices = by_id([gpu(0)], settings)
    assert {k: v for k, v in policy.allocate(["GPU-0000"], devices, settings).envs.items()
            if k != "NVIDIA_VISIBLE_DEVICES"} == FEATURES_OFF
    opted_in = settings._replace(mofed_enabled=True, nvswitch_enabled=True)
    envs = policy.allocate(["GPU-0000"], devices, opted_in).envs
    assert (envs["NVIDIA_MOFED"], envs["NVIDIA_NVSWITCH"], envs["NVIDIA_GDS"], envs["NVIDIA_GDRCOPY"]) == (
        "enabled", "enabled", "disabled", "disabled")
