"""check-image / build for a Jetson AGX Thor: the tegra264 list (NVIDIA's open kernel driver
built out of tree by nvidia-kernel-oot, its device-node unit, NVML, toolkit 1.19 pinned to CSV
mode, the A/B pieces) applies instead of the Orin's or the Nano's, from the closure the probe
reports, and every missing piece says why it matters."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tools.image import build, check_image
from tools.image import closure as ic
from tools.image import requirements as req
from tools.paths import REPO_ROOT

# MACHINEOVERRIDES of jetson-agx-thor-devkit as meta-tegra wrynose's machine includes compose
# them (tegra-common.inc prepends cuda:tegra:, soc-family.inc tegra264:).
THOR_OVERRIDES = ["aarch64", "armv9a", "cuda", "tegra", "tegra264", "jetson-agx-thor-devkit"]
T4000_OVERRIDES = ["aarch64", "armv9a", "cuda", "tegra", "tegra264", "jetson-agx-thor-t4000"]
ORIN_OVERRIDES = ["aarch64", "armv8-2a", "cuda", "tegra", "tegra234", "orin-nano", "jetson-orin-nano-devkit-nvme"]
COMMON = ["docker-moby", "k3s", "k3s-server", "gpu-device-plugin", "python3-hpack", "python3-pyyaml",
          "gpu-k8s-docker-config"]
# Package names as meta-tegra wrynose 727633de makes them: nvidia-kernel-oot's nv- prefixed
# module packages (TEGRA_OOT_DISPLAY_DRIVERS, TEGRA_OOT_COMPUTE_DRIVERS, TEGRA_OOT_BASE_DRIVERS),
# tegra-firmware's tegra264 package, tegra-configs' display-driver package.
THOR_GPU = ["nv-kernel-module-nvidia", "nv-kernel-module-nvidia-uvm", "nv-kernel-module-nvidia-drm",
            "nv-kernel-module-nvmap", "tegra-firmware-tegra264", "tegra-configs-display-driver",
            "gpu-k8s-nvidia-nodes", "tegra-configs-udev", "tegra-libraries-cuda", "tegra-libraries-nvml",
            "nvidia-container-toolkit", "libnvidia-container-tools", "tegra-configs-container-csv",
            "tegra-container-passthrough", "gpu-k8s-nvidia-runtime-config", "nv-tegra-release"]
UPDATES = ["mender-update", "tegra-rootfs-update-module", "tegra-redundant-boot-base", "tegra-uefi-capsules",
           "gpu-k8s-data", "gpu-k8s-update", "gpu-k8s-watchdog"]
ORIN_GPU = ["nv-kernel-module-nvgpu", "nv-kernel-module-nvmap", "nv-kernel-module-host1x", "tegra-firmware-tegra234",
            "tegra-configs-udev", "tegra-libraries-cuda", "nvidia-container-toolkit", "libnvidia-container-tools",
            "tegra-configs-container-csv", "tegra-container-passthrough", "gpu-k8s-nvidia-runtime-config",
            "nv-tegra-release"]


def result(installed: list[str], overrides: list[str], cuda: tuple[str, ...] = ("tegra-libraries-cuda",),
           level: str = "driver") -> check_image.ProbeResult:
    closure = ic.Closure()
    for name in installed:
        closure.installed[name] = ic.Installed(name, name, ic.BY_PACKAGE, name, ic.IMAGE, ic.IMAGE)
    return check_image.ProbeResult.from_json({
        "image": "gpu-k8s-image", "machine": overrides[-1], "machineoverrides": overrides,
        "target_arch": "aarch64", "cuda_level": level, "cuda_packages": list(cuda), "closure": closure.to_json()})


def test_thor_overrides_select_the_thor_list_for_both_modules() -> None:
    assert req.machine_classes(THOR_OVERRIDES, "aarch64") == [req.JETSON, req.JETSON_THOR]
    assert req.machine_classes(T4000_OVERRIDES, "aarch64") == [req.JETSON, req.JETSON_THOR]
    assert req.machine_classes(ORIN_OVERRIDES, "aarch64") == [req.JETSON, req.JETSON_ORIN]


def test_a_complete_thor_closure_passes_and_asks_nothing_of_nvgpu() -> None:
    findings = check_image.closure_findings(result(COMMON + THOR_GPU + UPDATES, THOR_OVERRIDES))
    assert [f.requirement.label for f in findings if not f.ok] == []
    labels = {f.requirement.label for f in findings}
    assert not labels & {"nv-kernel-module-nvgpu", "tegra-firmware-tegra234", "nv-kernel-module-host1x",
                         "kernel-module-nvgpu", "nvidia-container-runtime", "cuda-cudart"}


def test_the_orins_closure_on_a_thor_misses_the_open_driver_its_nodes_and_nvml_and_says_why() -> None:
    probe = result(COMMON + ORIN_GPU + UPDATES, THOR_OVERRIDES)
    findings = check_image.closure_findings(probe)
    missing = [f.requirement.label for f in findings if not f.ok]
    assert missing == ["nv-kernel-module-nvidia", "nv-kernel-module-nvidia-uvm", "nv-kernel-module-nvidia-drm",
                       "tegra-firmware-tegra264", "tegra-configs-display-driver", "gpu-k8s-nvidia-nodes",
                       "tegra-libraries-nvml"]
    report = "\n".join(check_image.report(probe, findings))
    assert "(jetson, jetson-thor)" in report
    assert "MISSING  nv-kernel-module-nvidia: nvidia.ko, NVIDIA's open kernel driver (OpenRM)" in report
    assert "MISSING  gpu-k8s-nvidia-nodes: the boot unit that loads nvidia-uvm" in report
    assert "GPU_K8S_CUDA = driver: tegra-libraries-cuda" in report
    assert f"7 of {len(findings)} required pieces missing" in report


def test_the_open_driver_built_into_a_kernel_satisfies_the_module_requirements_after_a_build() -> None:
    findings = req.evaluate(req.requirements_for([req.JETSON, req.JETSON_THOR]), lambda name: None,
                            builtin_modules={"nvidia", "nvidia-uvm"})
    by_label = {f.requirement.label: f.satisfied_by for f in findings}
    assert by_label["nv-kernel-module-nvidia"] == by_label["nv-kernel-module-nvidia-uvm"] == "built into the kernel"
    assert by_label["gpu-k8s-nvidia-nodes"] is None


def test_a_thor_without_the_updater_or_with_more_cuda_is_told_each_piece() -> None:
    probe = result(COMMON + THOR_GPU, THOR_OVERRIDES, cuda=("tegra-libraries-cuda", "cuda-cudart"), level="runtime")
    missing = [f.requirement.label for f in check_image.closure_findings(probe) if not f.ok]
    assert missing == [*UPDATES, "cuda-cudart"]


def test_both_thor_machines_are_checked_against_the_thor_list_and_install_the_native_payload() -> None:
    for name, machine in (("jetson-agx-thor", "jetson-agx-thor-devkit"), ("jetson-agx-thor-t4000",
                                                                          "jetson-agx-thor-t4000")):
        target = build.MACHINES[name]
        assert target.kinds == (req.JETSON, req.JETSON_THOR), name
        assert target.yocto_machine == machine and target.default_image == "gpu-k8s-image"
        assert target.kas_file.split(":")[0] == "kas/jetson-agx-thor.yml"
        assert target.update_payload == build.TEGRA_NATIVE_PAYLOAD and target.default_role == "server"
    assert build.MACHINES["jetson-agx-thor-t4000"].kas_file.endswith(":kas/include/machine-jetson-agx-thor-t4000.yml")


# The layers at our pins, where the parse tool keeps them: every name check-image asks for on a
# Jetson with L4T R39 must be a package some recipe there (or ours) really makes, or check-image
# reports a piece MISSING that no build could ever supply.
PARSE_ROOT = Path(os.environ.get("YOCTO_PARSE_ROOT", "/var/tmp/yocto-parse"))
PINNED_LAYERS = (PARSE_ROOT / "sources-wrynose/meta-tegra", PARSE_ROOT / "sources-wrynose/meta-mender",
                 Path(os.environ.get("MENDER_TEGRA_LOCAL", "/var/tmp/mender-tegra-local")), REPO_ROOT / "meta-gpu-k8s")
_PACKAGES = re.compile(r'^PACKAGES(?::[\w-]+)?\s*(?:=\+|\+=|=|\?=)\s*"([^"]*)"', re.M)
_OOT_MODULE = re.compile(r"\$\{KERNEL_MODULE_PACKAGE_PREFIX\}(kernel-module-[\w-]+)")


def declared_packages(layer: Path) -> set[str]:
    """Each recipe's PN (its file name up to '_'), the names its PACKAGES lines (in the recipe
    or its .inc files) declare with ${PN} expanded, and nvidia-kernel-oot's nv- module packages."""
    names: set[str] = set()
    for recipe in layer.rglob("*.bb"):
        pn = recipe.name.removesuffix(".bb").split("_")[0]
        names.add(pn)
        texts = [recipe.read_text(errors="replace")]
        texts += [inc.read_text(errors="replace") for inc in recipe.parent.glob("*.inc")]
        for text in texts:
            for block in _PACKAGES.findall(text):
                names |= {word.replace("${PN}", pn) for word in block.split() if word != "\\"}
            names |= {"nv-" + module for module in _OOT_MODULE.findall(text)}
    return names


@pytest.mark.skipif(not all(layer.is_dir() for layer in PINNED_LAYERS),
                    reason="the pinned layers (yocto-parse work tree, mender-tegra-local) are not on this host")
@pytest.mark.parametrize("family", [req.JETSON_THOR, req.JETSON_ORIN])
def test_every_r39_jetson_requirement_names_a_package_the_pinned_layers_make(family) -> None:
    made = set().union(*(declared_packages(layer) for layer in PINNED_LAYERS))
    requirements = req.requirements_for([req.JETSON, family], cuda_packages=["tegra-libraries-cuda"])
    jetson_only = [r for r in requirements if r not in req.requirements_for([])]
    unknown = [r.label for r in jetson_only if not set(r.names) & made]
    assert unknown == []
