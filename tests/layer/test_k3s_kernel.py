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
    "linux-noble-nvidia-tegra": LAYER / "dynamic-layers/tegra/recipes-kernel/linux/linux-noble-nvidia-tegra/"
    "gpu-k8s-containers.cfg",
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
        if kernel != "linux-yocto" or name == "RT_GROUP_SCHED":
            assert options.get(name) not in ("y", "m"), f"{kernel} enables {name}"


@pytest.mark.parametrize("kernel", ["linux-tegra", "linux-noble-nvidia-tegra"])
def test_jetson_fragments_build_everything_in(kernel):
    options = kernel_fragment(FRAGMENTS[kernel])
    assert {o for o, v in options.items() if v == "m"} == set(), "no module autoloading on a Jetson"


# Options the 6.8 kernel's arm64 defconfig builds as modules that the built-in ones above
# depend on: a =y request under a =m dependency silently ends as =m.
ORIN_BUILTIN_DEPENDENCIES = ("IPV6", "NETFILTER_XTABLES", "NF_CONNTRACK", "IP_NF_IPTABLES", "IP6_NF_IPTABLES",
                             "BRIDGE", "NETFILTER_ADVANCED")
# Kconfig symbols 4.9 had and 6.8 no longer has (merged into NF_CONNTRACK / NF_NAT / NF_NAT_MASQUERADE).
GONE_IN_6_8 = ("NF_CONNTRACK_IPV4", "NF_CONNTRACK_IPV6", "NF_NAT_IPV4", "NF_NAT_IPV6", "NF_NAT_MASQUERADE_IPV4",
               "NF_NAT_MASQUERADE_IPV6")


def test_orin_fragment_builds_in_what_its_options_depend_on_and_names_only_6_8_symbols():
    options = kernel_fragment(FRAGMENTS["linux-noble-nvidia-tegra"])
    assert all(options.get(name) == "y" for name in ORIN_BUILTIN_DEPENDENCIES), ORIN_BUILTIN_DEPENDENCIES
    assert not set(GONE_IN_6_8) & set(options)
    # cgroup v2: runc grants device access (the GPU's nodes too) with eBPF on the cgroup
    assert options["CGROUP_BPF"] == options["BPF_SYSCALL"] == "y"


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
    ("dynamic-layers/tegra/recipes-kernel/linux/linux-noble-nvidia-tegra_%.bbappend", "gpu_k8s_linux_tegra",
     "gpu-k8s-containers.cfg"),
    ("recipes-kernel/linux/linux-yocto_%.bbappend", "gpu_k8s_linux_yocto", "gpu-k8s-k3s.cfg"),
])
def test_fragment_reaches_its_kernel_through_the_gated_class(append, klass, fragment):
    assert f"'gpu-k8s', '{klass}'" in (LAYER / append).read_text()
    bb = parse(LAYER / "classes" / f"{klass}.bbclass")
    assert f"file://{fragment}" in bb.words("SRC_URI")
    extra = re.search(r"'\$\{THISDIR\}/([\w-]+):'", parse(LAYER / append).value("FILESEXTRAPATHS", "prepend"))
    assert (LAYER / append).parent.joinpath(extra.group(1), fragment).exists()


# The one series whose meta-tegra branch has each Jetson kernel recipe; elsewhere the bbappend
# would dangle (a parse error), so conf/series/<series>.inc masks it.
KERNEL_SERIES = {"linux-tegra_%.bbappend": "kirkstone", "linux-noble-nvidia-tegra_%.bbappend": "wrynose"}


@pytest.mark.parametrize(("append", "series"), sorted(KERNEL_SERIES.items()))
def test_each_jetson_kernel_append_is_parsed_only_on_its_series(append, series):
    path = LAYER / "dynamic-layers/tegra/recipes-kernel/linux" / append
    for candidate in ("kirkstone", "scarthgap", "wrynose"):
        text = (LAYER / "conf/series" / f"{candidate}.inc").read_text()
        masks = [m.replace("${GPU_K8S_LAYERDIR}", str(LAYER))
                 for m in re.findall(r'^BBMASK \+= "([^"]*)"$', text, re.M)]
        assert any(re.search(m, str(path)) for m in masks) == (candidate != series), (candidate, append)
