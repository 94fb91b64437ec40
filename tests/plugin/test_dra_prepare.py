"""Prepare = a CDI device per claim with exactly the edits the spec describing that GPU gives it: the
NVIDIA Container Toolkit's generated spec on a dGPU (and on a Jetson that has one), the CSV-derived
spec on a Jetson without one. Claims are checked (UID, allocation, pool, device), configuration is
ours or refused with the field named, sharing is applied, and the checkpoint keeps it all."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from dra_helpers import DRIVER, NODE, allocated_claim, result
from fake_nvml import FakeGpu, FakeNvml
from gpu_device_plugin.cdi.gpu_edits import gpu_edits
from gpu_device_plugin.cdi.toolkit_spec import ToolkitSpecs
from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.dra import claim_spec, claims, sharing
from gpu_device_plugin.dra.checkpoint import Checkpoint
from gpu_device_plugin.dra.kube import ApiError
from gpu_device_plugin.dra.prepare import ClaimRef, Preparer
from gpu_device_plugin.model import Gpu

FIXTURES = Path(__file__).parent / "fixtures"
UUID0 = "GPU-6a3c9e2f-0d4b-4c1e-9a57-1b2c3d4e5f60"
UUID1 = "GPU-7b4d0f30-1e5c-4d2f-8b68-2c3d4e5f6071"


def nvml_gpus(root: Path = FIXTURES / "x86-nvidia-580") -> list[Gpu]:
    fake = FakeNvml([FakeGpu(UUID0, name="NVIDIA L4", minor=0),
                     FakeGpu(UUID1, name="NVIDIA L4", minor=1, pci_bus_id="00000000:5E:00.0")],
                    driver_version="580.105.08", cuda_driver_version=13000)
    return NvmlBackend(str(root), fake).discover()


class Node:
    """A Preparer on a fixture host, its claims in a dict as the API server would hand them out."""

    def __init__(self, tmp_path: Path, root: Path, gpus: list[Gpu]) -> None:
        self.cdi = str(tmp_path / "cdi")
        self.state = str(tmp_path / "state")
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.commands: list[list[str]] = []
        self.fail_commands = ""
        settings = Settings(host_root=str(root))
        toolkit = ToolkitSpecs(str(root))
        self.gpus = gpus
        self.preparer = Preparer(DRIVER, NODE, self.cdi, self.checkpoint(), self.get_claim, lambda: self.gpus,
                                 lambda chosen: gpu_edits(chosen, settings, toolkit.specs()), self.run)

    def checkpoint(self) -> Checkpoint:
        checkpoint = Checkpoint(self.state, DRIVER, NODE)
        checkpoint.load()
        return checkpoint

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ApiError(404, "Not Found", f"resourceclaims {name} not found") from None

    def run(self, argv: list[str]) -> str:
        self.commands.append(argv)
        return self.fail_commands

    def add(self, claim: dict[str, Any]) -> ClaimRef:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim
        return ClaimRef(meta["namespace"], meta["uid"], meta["name"])

    def spec(self, uid: str) -> dict[str, Any]:
        with open(claim_spec.path(self.cdi, DRIVER, uid)) as f:
            return json.load(f)


def test_a_dgpu_claim_gets_the_toolkits_edits_for_that_gpu_and_its_libraries_and_hooks(tmp_path: Path) -> None:
    node = Node(tmp_path, FIXTURES / "x86-nvidia-580", nvml_gpus())
    ref = node.add(allocated_claim("infer", "uid-a", result("gpu-1")))
    outcome = node.preparer.prepare([ref])["uid-a"]
    assert outcome.error == ""
    spec = node.spec("uid-a")
    assert spec["kind"] == f"k8s.{DRIVER}/claim" and spec["cdiVersion"] == "0.5.0"
    [device] = spec["devices"]
    assert device == {"name": "uid-a-gpu-1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}
    common = spec["containerEdits"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in common["env"]
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert any("--host-driver-version=580.105.08" in h["args"] for h in common["hooks"])
    assert {m["hostPath"] for m in common["mounts"]} >= {"/usr/lib/libcuda.so.580.105.08"}
    assert outcome.devices[0].cdi_ids == [f"k8s.{DRIVER}/claim=uid-a-gpu-1"]


def test_a_dgpu_the_toolkit_spec_does_not_name_is_refused_with_the_fix(tmp_path: Path) -> None:
    root = tmp_path / "host"
    shutil.copytree(FIXTURES / "x86-nvidia-580", root, symlinks=True)
    os.unlink(root / "var/run/cdi/nvidia.yaml")
    node = Node(tmp_path, root, nvml_gpus(root))
    ref = node.add(allocated_claim("infer", "uid-a", result("gpu-0")))
    error = node.preparer.prepare([ref])["uid-a"].error
    assert "nvidia-ctk cdi generate" in error and UUID0 in error
    assert not os.path.exists(claim_spec.path(node.cdi, DRIVER, "uid-a"))


def test_an_orin_with_the_toolkits_csv_spec_gets_its_device_zero(tmp_path: Path) -> None:
    root = FIXTURES / "jetson-agx-orin-r36"
    node = Node(tmp_path, root, TegraBackend(str(root)).discover())
    ref = node.add(allocated_claim("vision", "uid-o", result("gpu-0")))
    assert node.preparer.prepare([ref])["uid-o"].error == ""
    nodes = [n["path"] for n in node.spec("uid-o")["devices"][0]["containerEdits"]["deviceNodes"]]
    assert "/dev/nvgpu/igpu0/channel" in nodes and "/dev/nvsciipc" in nodes  # as the toolkit's spec lists them


def test_an_orin_without_one_gets_the_csv_derived_edits_the_device_plugin_writes(tmp_path: Path) -> None:
    root = FIXTURES / "jetson-orin-nano-r39"
    node = Node(tmp_path, root, TegraBackend(str(root)).discover())
    ref = node.add(allocated_claim("vision", "uid-o", result("gpu-0")))
    assert node.preparer.prepare([ref])["uid-o"].error == ""
    spec = node.spec("uid-o")
    own = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert "/dev/nvgpu/igpu0/ctrl" in own and "/dev/nvmap" in own
    mounts = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert any("libcuda" in path for path in mounts), "the CUDA driver library from drivers.csv"


def test_several_claims_on_one_jetson_gpu_each_get_their_own_spec_and_share_ids_go_back(tmp_path: Path) -> None:
    root = FIXTURES / "jetson-orin-nano-r39"
    node = Node(tmp_path, root, TegraBackend(str(root)).discover())
    first = node.add(allocated_claim("a", "uid-1", result("gpu-0", shareID="s-1",
                                                          consumedCapacity={"memory": "2Gi"})))
    second = node.add(allocated_claim("b", "uid-2", result("gpu-0", request="gpu/small", shareID="s-2")))
    outcomes = node.preparer.prepare([first, second])
    assert [(d.device, d.share_id, d.requests) for d in outcomes["uid-1"].devices] == [("gpu-0", "s-1", ["gpu"])]
    assert [(d.device, d.share_id, d.requests) for d in outcomes["uid-2"].devices] == [("gpu-0", "s-2", ["gpu"])]
    assert os.path.exists(claim_spec.path(node.cdi, DRIVER, "uid-1"))
    assert os.path.exists(claim_spec.path(node.cdi, DRIVER, "uid-2"))


def time_slicing(interval: str = "Long", driver: str = DRIVER, source: str = "FromClaim",
                 requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": {
        "apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def test_time_slicing_on_a_dgpu_is_set_with_nvidia_smi_the_claims_config_over_the_classs(tmp_path: Path) -> None:
    node = Node(tmp_path, FIXTURES / "x86-nvidia-580", nvml_gpus())
    ref = node.add(allocated_claim("shared", "uid-t", result("gpu-0"),
                                   config=[time_slicing("Short", source="FromClass"), time_slicing("Long")]))
    assert node.preparer.prepare([ref])["uid-t"].error == ""
    assert node.commands == [["nvidia-smi", "-i", UUID0, "-c", "DEFAULT"],
                             ["nvidia-smi", "compute-policy", "-i", UUID0, "--set-timeslice", "3"]]


def test_a_failed_nvidia_smi_fails_that_claim_and_writes_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path, FIXTURES / "x86-nvidia-580", nvml_gpus())
    node.fail_commands = "Unable to set the compute mode: Insufficient Permissions"
    ref = node.add(allocated_claim("shared", "uid-t", result("gpu-0"), config=[time_slicing()]))
    error = node.preparer.prepare([ref])["uid-t"].error
    assert "Insufficient Permissions" in error and "nvidia-smi" in error
    assert not os.listdir(node.cdi) if os.path.isdir(node.cdi) else True


def test_a_jetson_takes_the_default_interval_and_refuses_another(tmp_path: Path) -> None:
    root = FIXTURES / "jetson-orin-nano-r39"
    node = Node(tmp_path, root, TegraBackend(str(root)).discover())
    ok = node.add(allocated_claim("a", "uid-1", result("gpu-0"), config=[time_slicing("Default")]))
    refused = node.add(allocated_claim("b", "uid-2", result("gpu-0"), config=[time_slicing("Medium")]))
    outcomes = node.preparer.prepare([ok, refused])
    assert outcomes["uid-1"].error == ""
    assert "interval Medium cannot be set on a Jetson" in outcomes["uid-2"].error
    assert node.commands == []


@pytest.mark.parametrize(("parameters", "message"), [
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}, "apiVersion/kind must be"),
    ({"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}, "MPS is not carried"),
    ({"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing",
                                                                          "timeSlicingConfig": {"interval": "Huge"}}},
     "interval must be one of Default, Short, Medium, Long"),
    ({"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "shareing": {}}, "unknown field(s) shareing"),
])
def test_a_configuration_we_cannot_apply_is_refused_naming_the_field(parameters: dict, message: str) -> None:
    claim = allocated_claim("c", "uid", result("gpu-0"),
                            config=[{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}])
    with pytest.raises(claims.PrepareRefused, match="claim config\\[0\\]") as refused:
        claims.plan(claim, "uid", DRIVER, NODE, {"gpu-0"})
    assert message in str(refused.value)


def test_configuration_for_another_driver_and_results_of_another_driver_are_theirs() -> None:
    claim = allocated_claim("c", "uid", result("gpu-0"), result("nic-0", driver="net.example.com", pool="x"),
                            config=[time_slicing(driver="gpu.nvidia.com"), time_slicing("Short", requests=["other"])])
    plan = claims.plan(claim, "uid", DRIVER, NODE, {"gpu-0"})
    assert [(d.device, d.config) for d in plan.devices] == [("gpu-0", sharing.GpuConfig())]


def test_claims_that_must_not_be_prepared_here_say_why() -> None:
    base = allocated_claim("c", "uid", result("gpu-7"))
    with pytest.raises(claims.PrepareRefused, match="gpu-7, which this node does not offer"):
        claims.plan(base, "uid", DRIVER, NODE, {"gpu-0"})
    with pytest.raises(claims.PrepareRefused, match="not allocated"):
        claims.plan({**base, "status": {}}, "uid", DRIVER, NODE, {"gpu-0"})
    with pytest.raises(claims.PrepareRefused, match="deleted and made again"):
        claims.plan(base, "other-uid", DRIVER, NODE, {"gpu-7"})


def test_the_checkpoint_makes_prepare_idempotent_and_a_broken_one_is_set_aside(tmp_path: Path) -> None:
    node = Node(tmp_path, FIXTURES / "x86-nvidia-580", SimulatedBackend(1).discover())
    ref = node.add(allocated_claim("c", "uid-1", result("gpu-0")))
    first = node.preparer.prepare([ref])["uid-1"]
    node.claims.clear()  # answered from the checkpoint: the API server is not asked again
    assert node.preparer.prepare([ref])["uid-1"] == first
    assert node.checkpoint().claims["uid-1"]["devices"][0]["device"] == "gpu-0"
    with open(os.path.join(node.state, "checkpoint.json"), "w") as f:
        f.write("{not json")
    assert node.checkpoint().claims == {}
    assert os.path.exists(os.path.join(node.state, "checkpoint.json.corrupt"))
    # unprepare finds the spec by the claim's UID even without the checkpoint's entry
    assert node.preparer.unprepare([ref]) == {"uid-1": ""}
    assert not os.path.exists(claim_spec.path(node.cdi, DRIVER, "uid-1"))


def test_a_checkpoint_that_cannot_be_written_fails_prepare_and_leaves_no_spec(tmp_path: Path) -> None:
    node = Node(tmp_path, FIXTURES / "x86-nvidia-580", SimulatedBackend(1).discover())
    Path(node.state).write_text("a file where the state directory should be")
    ref = node.add(allocated_claim("c", "uid-1", result("gpu-0")))
    error = node.preparer.prepare([ref])["uid-1"].error
    assert "cannot write the checkpoint" in error and "--state-dir" in error
    assert not os.path.exists(claim_spec.path(node.cdi, DRIVER, "uid-1"))
    assert node.preparer.checkpoint.claims == {}
