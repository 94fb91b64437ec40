"""Issue 12 point 4: our kernel fragments give what `k3s check-config` tests for the pinned
release (facts in recipes-containers/k3s/k3s-kernel-requirements.yaml)."""

from __future__ import annotations

import re

import pytest
from bbfile import parse
from k3s_layer import k3s_recipe, kernel_fragment, requirements
from layer_paths import LAYER

FRAGMENTS = {
    "linux-tegra": LAYER / "dynamic-layers/tegra/recipes-kernel/linux/linux-tegra/gpu-k8s-containers.cfg",
    "linux-yocto": LAYER / "recipes-kernel/linux/linux-yocto/gpu-k8s-k3s.cfg",
}


def wanted() -> set[str]:
    req = requirements()
    return (set(req["generally_necessary"]) | set(req["optional"]) | set(req["additional"])) - set(req["not_enabled"])


def test_requirements_list_is_check_configs_and_explains_every_exception():
    req = requirements()
    assert len(req["generally_necessary"]) == 30 and "BRIDGE_NETFILTER" in req["generally_necessary"]
    assert set(req["not_enabled"]) <= set(req["optional"]), "only optional options may be left out"
    assert all(len(reason.split()) >= 8 for reason in req["not_enabled"].values())


@pytest.mark.parametrize("kernel", sorted(FRAGMENTS))
def test_fragment_enables_everything_k3s_check_config_requires(kernel):
    options = kernel_fragment(FRAGMENTS[kernel])
    missing = sorted(o for o in wanted() if options.get(o) not in ("y", "m"))
    assert not missing, f"{kernel} fragment lacks {missing}"


@pytest.mark.parametrize("kernel", sorted(FRAGMENTS))
def test_fragment_leaves_out_what_the_list_explains(kernel):
    options = kernel_fragment(FRAGMENTS[kernel])
    for name in requirements()["not_enabled"]:
        if kernel == "linux-tegra" or name == "RT_GROUP_SCHED":
            assert options.get(name) not in ("y", "m"), f"{kernel} enables {name}"


def test_nano_fragment_builds_everything_in():
    options = kernel_fragment(FRAGMENTS["linux-tegra"])
    assert {o for o, v in options.items() if v == "m"} == set(), "no module autoloading on the Nano"


def test_x86_module_packages_are_what_k3s_recommends():
    modules = requirements()["x86_64_kernel_modules"]
    assert len(modules) == len(set(modules))
    assert set(parse(k3s_recipe()).words("RRECOMMENDS", "${PN}")) == set(modules)
    options = kernel_fragment(FRAGMENTS["linux-yocto"])
    for option in ("BRIDGE_NETFILTER", "IP_SET", "NETFILTER_XT_SET", "VXLAN"):
        assert options[option] == "m", f"{option} should be a module (its package is required)"


@pytest.mark.parametrize(("append", "klass", "fragment"), [
    ("dynamic-layers/tegra/recipes-kernel/linux/linux-tegra_%.bbappend", "gpu_k8s_linux_tegra",
     "gpu-k8s-containers.cfg"),
    ("recipes-kernel/linux/linux-yocto_%.bbappend", "gpu_k8s_linux_yocto", "gpu-k8s-k3s.cfg"),
])
def test_fragment_reaches_its_kernel_through_the_gated_class(append, klass, fragment):
    assert f"'gpu-k8s', '{klass}'" in (LAYER / append).read_text()
    bb = parse(LAYER / "classes" / f"{klass}.bbclass")
    assert f"file://{fragment}" in bb.words("SRC_URI")
    extra = re.search(r"'\$\{THISDIR\}/([\w-]+):'", parse(LAYER / append).value("FILESEXTRAPATHS", "prepend"))
    assert (LAYER / append).parent.joinpath(extra.group(1), fragment).exists()
