"""The DRA driver's cluster objects (plugin/deploy/gpu-dra.yaml, auto-deployed on k3s servers) and its
systemd unit: the classes select what the driver really publishes, nvidia.com/gpu maps only onto
nodes that chose `both`, the admission policy holds every slice of ours to its own node, and the
unit starts the driver the way the images need."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import yaml
from fake_nvml import FakeNvml, make_gpus
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.dra import attributes
from gpu_device_plugin.dra.settings import DEFAULT_DRIVER

PLUGIN = Path(__file__).resolve().parents[2] / "plugin"
FIXTURES = Path(__file__).parent / "fixtures"
DOCS = list(yaml.safe_load_all((PLUGIN / "deploy" / "gpu-dra.yaml").read_text()))


def classes() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in DOCS if d["kind"] == "DeviceClass"}


def every_machines_gpu() -> list:
    gpus = [TegraBackend(str(FIXTURES / name)).discover()[0]
            for name in ("jetson-nano", "jetson-agx-orin-r36", "jetson-orin-nano-r39", "jetson-agx-thor-r39")]
    gpus += NvmlBackend(str(FIXTURES / "x86-nvidia-580"), FakeNvml(make_gpus(1))).discover()
    return gpus + SimulatedBackend(1).discover()


def test_the_classes_are_every_gpu_jetsons_dgpus_and_the_nvidia_com_gpu_mapping() -> None:
    assert set(classes()) == {DEFAULT_DRIVER, f"jetson.{DEFAULT_DRIVER}", f"dgpu.{DEFAULT_DRIVER}",
                              f"nvidia-gpu.{DEFAULT_DRIVER}"}
    for obj in classes().values():
        assert obj["apiVersion"] == "resource.k8s.io/v1"
        [selector] = obj["spec"]["selectors"]
        assert selector["cel"]["expression"].startswith(f'device.driver == "{DEFAULT_DRIVER}"')
    mapping = classes()[f"nvidia-gpu.{DEFAULT_DRIVER}"]
    assert mapping["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResource" in mapping["spec"]["selectors"][0]["cel"]["expression"]
    assert sum("extendedResourceName" in c["spec"] for c in classes().values()) == 1, "one class per resource name"


def test_every_attribute_a_class_selects_on_is_published_for_every_machine() -> None:
    used = {name for obj in classes().values() for sel in obj["spec"]["selectors"]
            for name in re.findall(r'device\.attributes\["[^"]+"\]\.(\w+)', sel["cel"]["expression"])}
    assert used == {"integrated", "extendedResource"}
    for gpu in every_machines_gpu():
        published = attributes.attributes(gpu)
        assert used <= set(published), f"{gpu.name} lacks {used - set(published)}: a CEL error, not a match"
        assert all(next(iter(published[name])) == "bool" for name in used)


def test_the_admission_policy_binds_our_slices_to_the_node_that_writes_them() -> None:
    [policy] = [d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"]
    [binding] = [d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    # deletes stay open: the kubelet wipes a gone driver's slices, the garbage collector a deleted Node's
    assert (rule["resources"], rule["operations"]) == (["resourceslices"], ["CREATE", "UPDATE"])
    assert policy["spec"]["matchConditions"][0]["expression"] == f'object.spec.driver == "{DEFAULT_DRIVER}"'
    # what each rule lets through is proved in Kubernetes' own admission plugin (conformance/admission)
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    [validation] = policy["spec"]["validations"]
    assert validation["expression"] == "variables.byItsNode || variables.onlyOwnersRemoved"
    assert '"system:node:" + object.spec.nodeName' in variables["byItsNode"]
    assert '"system:nodes" in request.userInfo.groups' in variables["byItsNode"]
    assert "object.spec == oldObject.spec" in variables["onlyOwnersRemoved"]
    assert policy["spec"]["failurePolicy"] == "Fail"


def unit() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((PLUGIN / "systemd" / "gpu-dra-driver.service").read_text())
    return parser["Service"]


def test_the_unit_runs_the_driver_with_the_nodes_k3s_name_and_restarts_only_failures() -> None:
    service = unit()
    assert service["Type"] == "notify"
    assert " dra " in service["ExecStart"] and "--node-name ${K3S_NODE_NAME}" in service["ExecStart"]
    assert "--config-file /etc/gpu-device-plugin/config.yaml" in service["ExecStart"], "the device plugin's file"
    # where the device plugin serves, the driver says so (READY=1) and exits 0: not restarted in a loop
    assert service["Restart"] == "on-failure"
