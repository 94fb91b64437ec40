"""What the DRA driver publishes for each machine we ship (Nano, Orin, Thor and NVML fixtures): the
device attributes under NVIDIA's DRA driver's names and spellings, the Jetson-only ones, memory as
a capacity, sharing and taints; and how a pool's slices are planned (generations, chunks, what the
API server gives back)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml, make_gpus
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.dra import attributes, slices
from gpu_device_plugin.model import HEALTHY, Gpu, Health

FIXTURES = Path(__file__).parent / "fixtures"
DRIVER = "gpu.meta-gpu-k8s.io"


def tegra(name: str) -> Gpu:
    [gpu] = TegraBackend(str(FIXTURES / name)).discover()
    return gpu


def published(gpu: Gpu, health: Health = HEALTHY, mode: str = "auto") -> dict:
    return attributes.device(gpu, DRIVER, health, attributes.shares_allowed(gpu, mode), "NoSchedule")


def values(device: dict) -> dict:
    return {key: next(iter(value.values())) for key, value in device["attributes"].items()}


def test_orin_is_an_integrated_ampere_with_its_chip_and_l4t_release_and_shares_its_memory() -> None:
    device = published(tegra("jetson-agx-orin-r36"))
    assert device["name"] == "gpu-0"
    assert values(device) == {
        "type": "gpu", "index": 0, "productName": "Orin (T234)", "integrated": True, "extendedResource": False,
        "architecture": "Ampere",
        "cudaComputeCapability": "8.7.0", "chip": "T234", "model": "NVIDIA Jetson AGX Orin Developer Kit",
        "l4tRelease": "36.5.0"}
    assert device["attributes"]["cudaComputeCapability"] == {"version": "8.7.0"}
    assert device["attributes"]["integrated"] == {"bool": True}
    # a budget of the board's RAM, divided between claims; a claim that names no amount takes it all
    assert device["capacity"] == {"memory": {"value": "62827Mi", "requestPolicy": {"default": "62827Mi"}}}
    assert device["allowMultipleAllocations"] is True
    assert "taints" not in device


def test_thor_carries_its_open_driver_uuid_version_and_pci_address() -> None:
    attrs = values(published(tegra("jetson-agx-thor-r39")))
    assert attrs["uuid"] == "GPU-8d1b4c52-6e0a-5f3b-b7d4-2f9e61a0c3d8"
    assert (attrs["architecture"], attrs["cudaComputeCapability"]) == ("Blackwell", "11.0.0")
    assert (attrs["driverVersion"], attrs["l4tRelease"], attrs["chip"]) == ("595.78.0", "39.2.0", "T264")
    assert attrs[attributes.PCI_BUS_ID] == "0000:01:00.0"
    assert "brand" not in attrs  # NVML's brand is not read on a Jetson: left out, not guessed


def test_nano_is_a_maxwell_on_l4t_32() -> None:
    attrs = values(published(tegra("jetson-nano")))
    assert (attrs["architecture"], attrs["cudaComputeCapability"], attrs["l4tRelease"]) == (
        "Maxwell", "5.3.0", "32.7.6")
    assert (attrs["productName"], attrs["chip"], attrs["integrated"]) == ("Tegra X1 (T210)", "T210", True)
    assert "uuid" not in attrs and "driverVersion" not in attrs


def test_an_nvml_gpu_is_named_as_nvidias_dra_driver_names_it() -> None:
    fake = FakeNvml(make_gpus(2, name="NVIDIA A100-SXM4-40GB"), driver_version="580.105.08",
                    cuda_driver_version=13000)
    gpus = NvmlBackend(str(FIXTURES / "x86-nvidia-580"), fake).discover()
    device = published(gpus[1])
    assert device["name"] == "gpu-1"
    assert values(device) == {
        "type": "gpu", "index": 1, "productName": "NVIDIA A100-SXM4-40GB", "integrated": False,
        "extendedResource": False,
        "uuid": gpus[1].id, "brand": "Tesla", "architecture": "Ampere", "cudaComputeCapability": "8.0.0",
        "driverVersion": "580.105.8", "cudaDriverVersion": "13.0.0",
        attributes.PCI_BUS_ID: "0000:3c:00.0", attributes.NUMA_NODE: 1}
    assert device["capacity"] == {"memory": {"value": "40Gi"}}  # the API server's canonical form of 40960Mi
    assert "allowMultipleAllocations" not in device  # auto: a discrete GPU is given whole, as NVIDIA's driver does
    assert published(gpus[1], mode="on")["allowMultipleAllocations"] is True


def test_a_mig_gpu_is_left_out_and_said_so() -> None:
    fake = FakeNvml([FakeGpu("GPU-a", mig_mode=(1, 1)), FakeGpu("GPU-b", minor=1)])
    gpus = NvmlBackend(str(FIXTURES / "x86-nvidia-580"), fake).discover()
    kept, left = attributes.publishable(gpus)
    assert [g.id for g in kept] == ["GPU-b"]
    assert len(left) == 1 and "MIG" in left[0] and "GPU-a" in left[0]


def test_an_unhealthy_gpu_carries_the_drivers_taint_with_the_reason_as_a_label_value() -> None:
    device = published(tegra("jetson-orin-nano-r39"), Health(False, "nvgpu: gk20a_fifo_handle_mmu_fault (Xid 31) ... "
                                                                   + "x" * 80))
    [taint] = device["taints"]
    assert taint["key"] == f"{DRIVER}/unhealthy" and taint["effect"] == "NoSchedule"
    assert len(taint["value"]) <= 63 and taint["value"].startswith("nvgpu-gk20a_fifo_handle_mmu_fault-Xid-31")


@pytest.mark.parametrize(("text", "version"), [("8.7", "8.7.0"), ("580.95.05", "580.95.5"), ("R36.5.0", "36.5.0"),
                                               ("13.0", "13.0.0"), ("595.78", "595.78.0"), ("", ""),
                                               ("shared with the CPU", "")])
def test_versions_become_strict_semver(text: str, version: str) -> None:
    assert attributes.semver(text) == version


@pytest.mark.parametrize(("mib", "quantity"), [(62827, "62827Mi"), (40960, "40Gi"), (1024 * 1024, "1Ti"),
                                               (1536, "1536Mi")])
def test_memory_is_written_in_the_canonical_form_the_api_server_keeps(mib: int, quantity: str) -> None:
    assert attributes.mebibytes(mib) == quantity


# ---------------------------------------------------------------- planning a pool


def device(name: str, **extra: object) -> dict:
    return {"name": name, "attributes": {"type": {"string": "gpu"}}, **extra}


def found(name: str, devices: list[dict], generation: int = 1, count: int = 1, pool: str = "node-a") -> slices.Existing:
    return slices.Existing(name, "7", pool, generation, count, devices)


def test_a_new_pool_is_created_at_generation_one() -> None:
    plan = slices.plan("node-a", [], [device("gpu-0")], {})
    assert (plan.generation, plan.writes, plan.deletes) == (1, [slices.Write("", "", 0)], [])
    obj = slices.slice_object("node-a", DRIVER, plan, plan.writes[0], {"name": "node-a", "uid": "u"})
    assert obj["metadata"]["generateName"] == f"node-a-{DRIVER}-"
    assert obj["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "Node"


def test_an_unchanged_pool_is_not_written_and_a_changed_one_goes_up_a_generation() -> None:
    current = [found("s1", [device("gpu-0")], generation=3)]
    assert slices.plan("node-a", current, [device("gpu-0")], {}).empty
    plan = slices.plan("node-a", current, [device("gpu-0", taints=[{"key": "k", "effect": "NoSchedule"}])], {})
    assert (plan.generation, plan.writes) == (4, [slices.Write("s1", "7", 0)])


def test_what_the_api_server_dropped_from_our_last_write_is_no_change() -> None:
    sent = [device("gpu-0", taints=[{"key": "k", "effect": "NoSchedule"}], allowMultipleAllocations=True)]
    kept = [device("gpu-0")]  # a server with both gates off keeps neither
    plan = slices.plan("node-a", [found("s1", kept)], sent, {"s1": (sent, kept)})
    assert plan.empty, "writing again what the server drops would loop forever"
    assert not slices.plan("node-a", [found("s1", kept)], [device("gpu-1")], {"s1": (sent, kept)}).empty


def test_more_than_64_gpus_take_two_slices_and_leftovers_go() -> None:
    many = [device(f"gpu-{i:03d}") for i in range(70)]
    plan = slices.plan("node-a", [found("s1", [device("gpu-000")]), found("s2", []), found("s3", []),
                                  found("old", [], pool="old-name")], many, {})
    assert [len(chunk) for chunk in plan.chunks] == [64, 6]
    assert plan.writes == [slices.Write("s1", "7", 0), slices.Write("s2", "7", 1)]
    assert plan.deletes == ["s3", "old"]
    assert slices.slice_object("node-a", DRIVER, plan, plan.writes[1], None)["spec"]["pool"]["resourceSliceCount"] == 2


def test_no_gpu_means_no_slice() -> None:
    plan = slices.plan("node-a", [found("s1", [device("gpu-0")])], [], {})
    assert (plan.writes, plan.deletes) == ([], ["s1"])


@pytest.mark.parametrize("fixture", ["jetson-nano", "jetson-agx-orin-r36", "jetson-orin-nano-r39",
                                     "jetson-agx-thor-r39"])
def test_every_value_fits_the_apis_64_bytes_or_the_whole_slice_is_refused(fixture: str) -> None:
    # found by the real API server in the Go harness: the Orin Nano Super's board name is 65 bytes
    for key, value in published(tegra(fixture))["attributes"].items():
        text = value.get("string") or value.get("version") or ""
        assert len(text.encode()) <= attributes.MAX_VALUE_BYTES, (key, text)
    model = values(published(tegra("jetson-orin-nano-r39")))["model"]
    assert model == "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Supe"
    assert attributes.fit("é" * 40) == "é" * 32  # whole characters only
