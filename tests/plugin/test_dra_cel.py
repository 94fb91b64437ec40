"""The DeviceClasses (plugin/deploy/gpu-dra.yaml) and the selectors docs/dra.md and README.md tell users
to write, compiled and evaluated by the scheduler's own CEL compiler (k8s.io/dynamic-resource-allocation/cel
of conformance/'s pin, through conformance/cmd/celcheck) against the devices we publish for every machine: each class
selects what its name says, and `cudaComputeCapability >= 8.7`, a chip, 16 GiB select the right GPUs.

Runs where Go is installed and conformance/'s modules are in build/go (the conformance leg of
`./task test` fetches them from the module proxy before the plugin legs); elsewhere it skips saying so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import go_caches
import pytest
import yaml
from fake_nvml import FakeGpu, FakeNvml
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.dra import attributes
from gpu_device_plugin.model import HEALTHY

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
DRIVER = "gpu.meta-gpu-k8s.io"
CLASSES = {d["metadata"]["name"]: d["spec"]["selectors"][0]["cel"]["expression"]
           for d in yaml.safe_load_all((ROOT / "plugin/deploy/gpu-dra.yaml").read_text()) if d["kind"] == "DeviceClass"}
CC_87 = f'device.attributes["{DRIVER}"].cudaComputeCapability.compareTo(semver("8.7.0")) >= 0'
# the same where a device may lack the attribute (a mixed fleet, simulated GPUs): CEL fails on a missing
# attribute, and the scheduler then leaves that node out with the error
CC_87_GUARDED = f'"cudaComputeCapability" in device.attributes["{DRIVER}"] && {CC_87}'
MEMORY_16G = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("16Gi")) >= 0'


def chip(name: str) -> str:
    return f'device.attributes["{DRIVER}"].chip == "{name}"'


@pytest.fixture(scope="module")
def celcheck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain to build the scheduler's CEL compiler")
    out = tmp_path_factory.mktemp("celcheck") / "celcheck"
    done = subprocess.run(["go", "build", "-o", str(out), "./cmd/celcheck"], cwd=go_caches.CONFORMANCE,
                          env=go_caches.go_env(GOPROXY="off"), capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        pytest.skip(f"conformance/'s Go modules are not in {go_caches.MODULE_CACHE} (the conformance leg of "
                    f"./task test fetches them): "
                    f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return out


def machines() -> dict[str, dict]:
    gpus = {name: TegraBackend(str(FIXTURES / fixture)).discover()[0]
            for name, fixture in (("nano", "jetson-nano"), ("agx-orin", "jetson-agx-orin-r36"),
                                  ("orin-nano", "jetson-orin-nano-r39"), ("thor", "jetson-agx-thor-r39"))}
    fake = FakeNvml([FakeGpu("GPU-a100", name="NVIDIA A100-SXM4-40GB", memory_mib=40960, minor=0),
                     FakeGpu("GPU-l4", name="NVIDIA L4", memory_mib=23034, minor=1, compute_capability=(8, 9),
                             pci_bus_id="00000000:5E:00.0")])
    gpus["a100"], gpus["l4"] = NvmlBackend(str(FIXTURES / "x86-nvidia-580"), fake).discover()
    gpus["simulated"] = SimulatedBackend(1).discover()[0]
    out = {name: attributes.device(gpu, DRIVER, HEALTHY, attributes.shares_allowed(gpu, "auto"), "NoSchedule")
           for name, gpu in gpus.items()}
    both = dict(gpus["l4"]._asdict())
    out["l4-on-a-both-node"] = attributes.device(type(gpus["l4"])(**both), DRIVER, HEALTHY, False, "NoSchedule",
                                                 extended_resource=True)
    return out


def evaluate(celcheck: Path, expressions: list[str]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """For each expression: the devices it selects, and those it fails on (a CEL runtime error)."""
    devices = machines()
    names = list(devices)
    request = {"expressions": expressions, "devices": [{"driver": DRIVER, "device": devices[n]} for n in names]}
    done = subprocess.run([str(celcheck)], input=json.dumps(request), capture_output=True, text=True, timeout=120,
                          check=True)
    answer = json.loads(done.stdout)
    assert answer["errors"] == {}, f"CEL the scheduler refuses: {answer['errors']}"
    matched, failed = {}, {}
    for expression, row in zip(expressions, answer["matches"], strict=True):
        matched[expression] = {name for name, value in zip(names, row, strict=True) if value is True}
        failed[expression] = {name for name, value in zip(names, row, strict=True) if not isinstance(value, bool)}
    return matched, failed


def test_each_class_selects_what_its_name_says(celcheck: Path) -> None:
    result, failed = evaluate(celcheck, list(CLASSES.values()))
    assert not any(failed.values()), f"a class's CEL fails on a device of ours: {failed}"
    everything = set(machines())
    jetsons = {"nano", "agx-orin", "orin-nano", "thor"}
    assert result[CLASSES[DRIVER]] == everything
    assert result[CLASSES[f"jetson.{DRIVER}"]] == jetsons
    assert result[CLASSES[f"dgpu.{DRIVER}"]] == everything - jetsons
    assert result[CLASSES[f"nvidia-gpu.{DRIVER}"]] == {"l4-on-a-both-node"}


def test_the_selectors_the_docs_show_select_the_gpus_they_promise(celcheck: Path) -> None:
    # a request's selectors are evaluated only on devices its class selected: class && selector
    jetson, dgpu, ours = (f"({CLASSES[name]})" for name in (f"jetson.{DRIVER}", f"dgpu.{DRIVER}", DRIVER))
    lines = {"orin": f"{jetson} && {chip('T234')}", "thor": f"{jetson} && {chip('T264')}",
             "nano": f"{jetson} && {chip('T210')}", "cc": f"{dgpu} && {CC_87}",
             "cc-guarded": f"{ours} && {CC_87_GUARDED}", "16Gi": f"{ours} && {MEMORY_16G}"}
    result, failed = evaluate(celcheck, list(lines.values()))
    selected = {name: result[expression] for name, expression in lines.items()}
    assert selected == {"orin": {"agx-orin", "orin-nano"}, "thor": {"thor"}, "nano": {"nano"},
                        "cc": {"l4", "l4-on-a-both-node"},  # 8.9 yes, the A100's 8.0 no
                        "cc-guarded": {"agx-orin", "orin-nano", "thor", "l4", "l4-on-a-both-node"},
                        "16Gi": {"agx-orin", "thor", "a100", "l4", "l4-on-a-both-node"}}
    # a simulated GPU (QEMU) has no compute capability: CEL fails on it, so the scheduler leaves that node
    # out with the error; the guarded form matches no device there instead
    assert {name: failed[expression] for name, expression in lines.items() if failed[expression]} == {
        "cc": {"simulated"}}


def test_the_docs_still_show_those_selectors() -> None:
    text = (ROOT / "docs" / "dra.md").read_text() + (ROOT / "README.md").read_text()
    for expression in (CC_87, CC_87_GUARDED, MEMORY_16G, chip("T234")):
        assert expression.replace('"', "'") in text.replace('"', "'"), expression
