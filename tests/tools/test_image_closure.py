"""Runtime closure resolution (tools/image/closure.py) on parse data built here, shaped like
what bitbake reports for our Jetson and x86-64 images at the pinned upstream commits."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tools.image import check_image
from tools.image import closure as ic
from tools.image import requirements as req

REPO_ROOT = Path(__file__).resolve().parents[2]
LAYER = REPO_ROOT / "meta-gpu-k8s"
sys.path.insert(0, str(REPO_ROOT / "tests" / "layer"))
from bbfile import parse  # noqa: E402

# MACHINE_EXTRA_RDEPENDS / _RRECOMMENDS of meta-tegra's tegra-common.inc at the pinned commit
TEGRA_MACHINE_EXTRA_RDEPENDS = ("tegra-nvpmodel", "tegra-nvphs", "tegra-nvs-service", "tegra-nvstartup",
                                "tegra-configs-udev")
TEGRA_MACHINE_EXTRA_RRECOMMENDS = ("kernel-module-nvgpu", "kernel-module-tegra-udrm")
PLUGIN_RDEPENDS = ("python3-hpack", "python3-pyyaml", "python3-core")
MAIN_IMAGE_INSTALL = ("packagegroup-core-boot", "packagegroup-gpu-k8s")  # before issue 8


def recipe(pn: str, packages=None, rdepends=None, rrecommends=None, dynamic=(), provides=(), rid=None):
    packages = tuple(packages or (pn,))
    return ic.Recipe(
        recipe_id=rid or f"/layers/{pn}.bb",
        pn=pn,
        packages=packages,
        packages_dynamic=tuple(dynamic),
        rdepends={pkg: tuple(deps) for pkg, deps in (rdepends or {}).items()},
        rrecommends={pkg: tuple(recs) for pkg, recs in (rrecommends or {}).items()},
        provides=tuple(provides) or (pn,),
    )


def nano_container_packages() -> list[str]:
    """GPU_K8S_NVIDIA_CONTAINER_PACKAGES for the Nano (tegra210), from classes/gpu_k8s_platform."""
    return parse(LAYER / "classes/gpu_k8s_platform.bbclass").words("GPU_K8S_NVIDIA_CONTAINER_PACKAGES", "tegra210")


def packagegroup_words(var_overrides: tuple[str, ...], cuda_level: str = "runtime") -> list[str]:
    """The packagegroup's list as the layer writes it, with the CUDA knob expanded."""
    bb = parse(LAYER / "recipes-core/packagegroups/packagegroup-gpu-k8s.bb")
    words = bb.words(*var_overrides)
    levels = re.findall(r"\('(\w+)', '([^']+)'\)", (LAYER / "recipes-core/packagegroups/packagegroup-gpu-k8s.bb")
                        .read_text())
    names = [name for name, _ in levels]
    cuda = [pkg for _, pkgs in levels[: names.index(cuda_level) + 1] for pkg in pkgs.split()]
    expanded = []
    for word in words:
        if word == "${GPU_K8S_CUDA_PACKAGES}":
            expanded += cuda
        elif word == "${GPU_K8S_K3S_PACKAGE}":
            expanded.append("k3s-server")
        elif word == "${GPU_K8S_KERNEL_MODULES}":
            expanded += bb.words("GPU_K8S_KERNEL_MODULES")
        elif word == "${GPU_K8S_NVIDIA_CONTAINER_PACKAGES}":
            expanded += nano_container_packages()
        elif word == "${GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE}":
            # the Nano's (tegra210): none, its toolkit 1.0.5 has no setup unit to extend
            expanded += parse(LAYER / "classes/gpu_k8s_platform.bbclass").words(
                "GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE", "tegra210")
        elif word == "${GPU_K8S_NVIDIA_NODES_PACKAGE}":
            # Thor's alone (tegra264): the Nano's driver makes its own nodes
            expanded += parse(LAYER / "classes/gpu_k8s_platform.bbclass").words("GPU_K8S_NVIDIA_NODES_PACKAGE")
        elif word == "${GPU_K8S_NVML_PYTHON_PACKAGE}":
            # Thor's alone (tegra264): nvgpu has a load file, NVML is not asked there
            expanded += parse(LAYER / "classes/gpu_k8s_platform.bbclass").words("GPU_K8S_NVML_PYTHON_PACKAGE")
        else:
            expanded.append(word)
    return expanded


# meta-virtualization's k3s at the pinned commit recommends these (and more xt modules),
# but not br_netfilter, ip_set or xt_set
META_VIRT_K3S_RECOMMENDS = ["kernel-module-vxlan", "kernel-module-xt-nat"]


def world(tegra: bool, group_rdepends=None, group_rrecommends=None, k3s_recommends=None) -> list[ic.Recipe]:
    if group_rdepends is None:
        group_rdepends = packagegroup_words(("RDEPENDS", "${PN}"))
        if tegra:
            group_rdepends += packagegroup_words(("RDEPENDS", "${PN}", "append", "tegra"))
    if group_rrecommends is None:
        group_rrecommends = packagegroup_words(("RRECOMMENDS", "${PN}"))
    kernel = "linux-tegra" if tegra else "linux-yocto"
    machine_rdepends = TEGRA_MACHINE_EXTRA_RDEPENDS if tegra else ()
    machine_rrecommends = TEGRA_MACHINE_EXTRA_RRECOMMENDS if tegra else ("kernel-modules",)
    recipes = [
        recipe("packagegroup-core-boot", rdepends={"packagegroup-core-boot": ["systemd", "base-files"]}),
        recipe("packagegroup-base", packages=["packagegroup-base", "packagegroup-base-extended",
                                              "packagegroup-machine-base"],
               rdepends={"packagegroup-machine-base": machine_rdepends},
               rrecommends={"packagegroup-machine-base": machine_rrecommends}),
        recipe("packagegroup-gpu-k8s", rdepends={"packagegroup-gpu-k8s": group_rdepends},
               rrecommends={"packagegroup-gpu-k8s": group_rrecommends}),
        recipe(kernel, packages=["kernel", "kernel-base", "kernel-image", "kernel-modules"],
               dynamic=["^kernel-module-.*", "^kernel-image-.*"], provides=["virtual/kernel"]),
        recipe("systemd"), recipe("base-files"), recipe("ca-certificates"),
        recipe("docker-ce", rdepends={"docker-ce": ["containerd-opencontainers"]}),
        recipe("containerd-opencontainers"),
        recipe("k3s", packages=["k3s-server", "k3s-agent", "k3s"],
               rdepends={"k3s-server": ["k3s"], "k3s-agent": ["k3s"], "k3s": ["ipset"]},
               # the layer's k3s recipe recommends what its kernel requirements list names
               rrecommends={"k3s": k3s_recommends if k3s_recommends is not None
                            else META_VIRT_K3S_RECOMMENDS + req.k3s_module_packages()}),
        recipe("ipset"),
        recipe("gpu-device-plugin", rdepends={"gpu-device-plugin": PLUGIN_RDEPENDS}),
        recipe("python3-hpack"), recipe("python3-pyyaml"), recipe("python3", packages=["python3-core"]),
        recipe("gpu-k8s-docker-config"), recipe("gpu-k8s-k3s-config"), recipe("gpu-k8s-preload-images"),
    ]
    if tegra:
        recipes += [recipe(name) for name in TEGRA_MACHINE_EXTRA_RDEPENDS]
        recipes += [
            recipe("nvidia-container-runtime",
                   rdepends={"nvidia-container-runtime": ["nvidia-container-toolkit", "docker"]}),
            recipe("nvidia-container-toolkit",
                   rdepends={"nvidia-container-toolkit": ["libnvidia-container-tools", "docker"]}),
            recipe("libnvidia-container-tools",
                   rdepends={"libnvidia-container-tools": ["tegra-container-passthrough"]}),
            recipe("tegra-container-passthrough"),
            # container-runtime-csv.bbclass: the library package depends on its CSV package
            recipe("tegra-libraries-cuda",
                   packages=["tegra-libraries-cuda-container-csv", "tegra-libraries-cuda"],
                   rdepends={"tegra-libraries-cuda": ["tegra-libraries-cuda-container-csv"]},
                   rrecommends={"tegra-libraries-cuda": ["kernel-module-nvgpu"]}),
            recipe("cuda-cudart", packages=["cuda-cudart-container-csv", "cuda-cudart"],
                   rdepends={"cuda-cudart": ["cuda-cudart-container-csv"]}),
        ]
    return recipes


RPROVIDES = {"/layers/docker-ce.bb": {"docker-ce": ["docker"]},
             "/layers/containerd-opencontainers.bb": {"containerd-opencontainers": ["virtual-containerd"]}}


def source(recipes, **kwargs) -> ic.DictSource:
    return ic.DictSource(recipes, rprovides=kwargs.pop("rprovides", RPROVIDES), **kwargs)


def layer_image_install() -> list[str]:
    bb = parse(LAYER / "recipes-core/images/gpu-k8s-image.inc")
    return [word for word in bb.words("IMAGE_INSTALL") if not word.startswith("${")]


def findings_for(closure: ic.Closure, classes, cuda=("tegra-libraries-cuda", "cuda-cudart")):
    result = check_image.ProbeResult("gpu-k8s-image", "m", list(classes), "runtime", list(cuda), closure)
    return result, check_image.closure_findings(result)


def missing(findings) -> set[str]:
    return {f.requirement.label for f in findings if not f.ok}


def test_main_before_issue_8_misses_the_nvgpu_driver_and_says_why() -> None:
    # main's image list and packagegroup: no packagegroup-machine-base, no CUDA libraries
    old_group = ["k3s-server", "ca-certificates", "docker", "gpu-device-plugin", "gpu-k8s-docker-config",
                 "gpu-k8s-k3s-config", "libnvidia-container-tools", "nvidia-container-runtime",
                 "nvidia-container-toolkit"]
    closure = ic.resolve(MAIN_IMAGE_INSTALL, source(world(True, old_group, [])))
    assert not closure.unresolved
    assert "kernel-module-nvgpu" not in closure.installed
    result, findings = findings_for(closure, [req.JETSON])
    assert {"kernel-module-nvgpu", "tegra-configs-udev", "tegra-libraries-cuda", "cuda-cudart"} <= missing(findings)
    lines = check_image.report(result, findings)
    driver = next(line for line in lines if "kernel-module-nvgpu" in line)
    assert driver.strip().startswith("MISSING") and "/dev/nvhost-gpu" in driver
    assert "required pieces missing" in lines[-1]


def test_the_layer_image_carries_driver_machine_pieces_and_cuda_on_jetson() -> None:
    install = layer_image_install()
    assert "packagegroup-machine-base" in install
    closure = ic.resolve(install, source(world(True)))
    assert not closure.unresolved, closure.unresolved
    _, findings = findings_for(closure, [req.JETSON])
    assert missing(findings) == set()
    nvgpu = closure.installed["kernel-module-nvgpu"]
    assert nvgpu.pn == "linux-tegra" and nvgpu.how == ic.BY_DYNAMIC
    assert closure.chain("kernel-module-nvgpu")[0] in {"packagegroup-machine-base", "tegra-libraries-cuda"}
    assert "tegra-libraries-cuda-container-csv" in closure.installed


def test_bad_recommendations_take_the_driver_out_again() -> None:
    closure = ic.resolve(layer_image_install(), source(world(True)),
                         bad_recommendations=["kernel-module-nvgpu"])
    assert "kernel-module-nvgpu" not in closure.installed
    assert ("kernel-module-nvgpu", "BAD_RECOMMENDATIONS") in closure.skipped
    assert "kernel-module-nvgpu" in missing(findings_for(closure, [req.JETSON])[1])


def test_x86_closure_has_the_k3s_netfilter_modules_as_dynamic_kernel_packages() -> None:
    closure = ic.resolve(layer_image_install(), source(world(False)))
    result, findings = findings_for(closure, [req.X86_64], cuda=())
    assert missing(findings) == set()
    for module in ("br_netfilter", "ip_set", "xt_set"):
        entry = closure.installed[req.module_package(module)]
        assert (entry.pn, entry.how, entry.kind) == ("linux-yocto", ic.BY_DYNAMIC, ic.RECOMMENDS)
    line = next(line for line in check_image.report(result, findings) if "kernel-module-br-netfilter" in line)
    assert "made only if the kernel builds the module" in line


def test_x86_closure_without_the_module_recommends_reports_them_missing() -> None:
    closure = ic.resolve(MAIN_IMAGE_INSTALL, source(world(False, group_rrecommends=[],
                                                          k3s_recommends=META_VIRT_K3S_RECOMMENDS)))
    assert {"kernel-module-br-netfilter", "kernel-module-ip-set", "kernel-module-xt-set"} <= missing(
        findings_for(closure, [req.X86_64], cuda=())[1])


def test_runtime_name_resolves_to_the_package_that_rprovides_it() -> None:
    closure = ic.resolve(["docker"], source(world(False)))
    assert closure.names["docker"] == "docker-ce"
    assert closure.installed["docker-ce"].how == ic.BY_RPROVIDES


def test_preferred_rprovider_decides_between_recipes_and_an_undecided_choice_is_noted() -> None:
    recipes = [recipe("docker-ce"), recipe("docker-moby")]
    rprovides = {"/layers/docker-ce.bb": {"docker-ce": ["docker"]},
                 "/layers/docker-moby.bb": {"docker-moby": ["docker"]}}
    chosen = ic.resolve(["docker"], source(recipes, rprovides=rprovides,
                                           settings={"PREFERRED_RPROVIDER_docker": "docker-moby"}))
    assert chosen.names["docker"] == "docker-moby" and not chosen.notes
    undecided = ic.resolve(["docker"], source(recipes, rprovides=rprovides))
    assert undecided.names["docker"] == "docker-ce"
    assert "PREFERRED_RPROVIDER_docker" in undecided.notes[0]


def test_only_the_preferred_version_of_a_recipe_counts() -> None:
    old = recipe("k3s", rid="/layers/k3s_1.0.bb", rdepends={"k3s": ["old-dep"]})
    new = recipe("k3s", rid="/layers/k3s_2.0.bb", rdepends={"k3s": ["new-dep"]})
    closure = ic.resolve(["k3s"], source([old, new, recipe("new-dep"), recipe("old-dep")],
                                         preferred={"k3s": "/layers/k3s_2.0.bb"}))
    assert "new-dep" in closure.installed and "old-dep" not in closure.installed


def test_native_variants_never_provide_target_packages() -> None:
    native = recipe("python3-grpcio", rid="virtual:native:/layers/python3-grpcio.bb")
    closure = ic.resolve(["python3-grpcio"], source([native]))
    assert closure.unresolved[0].reason == "nothing provides it"


def test_unprovided_depends_are_errors_unprovided_recommends_are_skipped() -> None:
    group = recipe("group", rdepends={"group": ["no-such-thing"]}, rrecommends={"group": ["nice-to-have"]})
    closure = ic.resolve(["group"], source([group]))
    assert [(u.name, u.via, u.kind) for u in closure.unresolved] == [("no-such-thing", "group", ic.DEPENDS)]
    assert closure.skipped[0][0] == "nice-to-have"
    assert ic.resolve(["group"], source([group]), package_exclude=["no-such-thing"]).unresolved[0].reason == (
        "listed in PACKAGE_EXCLUDE")


def test_dependency_cycles_end() -> None:
    a = recipe("a", rdepends={"a": ["b"]})
    b = recipe("b", rdepends={"b": ["a"]})
    closure = ic.resolve(["a"], source([a, b]))
    assert set(closure.installed) == {"a", "b"}
    assert closure.chain("b") == ["a", "b"]


def test_closure_survives_the_json_trip_from_the_probe() -> None:
    closure = ic.resolve(layer_image_install(), source(world(True)), bad_recommendations=["kernel-module-tegra-udrm"])
    again = ic.Closure.from_json(json.loads(json.dumps(closure.to_json())))
    assert again.installed == closure.installed
    assert again.names == closure.names and again.skipped == closure.skipped


@pytest.mark.parametrize("level", ["driver", "runtime", "libraries", "cudnn", "tensorrt"])
def test_every_cuda_level_is_known_to_the_requirement_list(level: str) -> None:
    cuda = [word for word in packagegroup_words(("RDEPENDS", "${PN}", "append", "tegra"), level)
            if word not in {"libnvidia-container-tools", "nvidia-container-runtime", "nvidia-container-toolkit"}]
    assert cuda[0] == "tegra-libraries-cuda"
    labels = {r.label for r in req.requirements_for([req.JETSON], cuda)}
    assert set(cuda) <= labels
