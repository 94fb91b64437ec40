"""The after-build check (tools/image/manifest.py) on fake deploy and pkgdata directories laid
out as kirkstone writes them, and the requirement list kept equal to what the layer installs."""

from __future__ import annotations

import io
import re
import sys
import tarfile
from pathlib import Path

import pytest

from tools.image import manifest as im
from tools.image import requirements as req

REPO_ROOT = Path(__file__).resolve().parents[2]
GROUP = REPO_ROOT / "meta-gpu-k8s/recipes-core/packagegroups/packagegroup-gpu-k8s.bb"
sys.path.insert(0, str(REPO_ROOT / "tests" / "layer"))
from bbfile import parse  # noqa: E402

MACHINE = "jetson-nano-devkit"
JETSON_CUDA = req.cuda_packages("runtime")


def complete_jetson_names() -> list[str]:
    required = req.requirements_for([req.JETSON], JETSON_CUDA)
    names = ["docker-ce" if r.label == "docker" else r.names[0] for r in required]
    return names + ["busybox", "systemd"]


def write_manifest(deploy: Path, names: list[str], stamped: bool = False) -> Path:
    deploy.mkdir(parents=True, exist_ok=True)
    suffix = "-20261123.rootfs.manifest" if stamped else ".manifest"
    path = deploy / f"gpu-k8s-image-{MACHINE}{suffix}"
    path.write_text("".join(f"{name} armv8a_tegra210 1.0-r0\n" for name in names))
    return path


def write_modules_tarball(deploy: Path, builtin: list[str]) -> None:
    with tarfile.open(deploy / f"modules-{MACHINE}.tgz", "w:gz") as archive:
        data = "".join(f"kernel/{name}.ko\n" for name in builtin).encode()
        info = tarfile.TarInfo("./lib/modules/4.9.337-l4t-r32.7.6/modules.builtin")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))


def missing(findings) -> list[str]:
    return [f.requirement.label for f in findings if not f.ok]


def test_complete_jetson_manifest_passes(tmp_path: Path) -> None:
    write_manifest(tmp_path, complete_jetson_names())
    manifest, findings = im.check_manifest(tmp_path, "gpu-k8s-image", MACHINE, [req.JETSON], JETSON_CUDA)
    assert manifest.name == f"gpu-k8s-image-{MACHINE}.manifest"
    assert missing(findings) == []


def test_manifest_without_the_driver_names_it_and_why(tmp_path: Path) -> None:
    write_manifest(tmp_path, [n for n in complete_jetson_names() if n != "kernel-module-nvgpu"], stamped=True)
    _, findings = im.check_manifest(tmp_path, "gpu-k8s-image", MACHINE, [req.JETSON], JETSON_CUDA)
    assert missing(findings) == ["kernel-module-nvgpu"]
    line = next(line for line in req.report_lines(findings) if "nvgpu" in line)
    assert line.strip().startswith("MISSING") and "GPU pods stay Pending" in line


def test_a_module_built_into_the_kernel_counts(tmp_path: Path) -> None:
    write_manifest(tmp_path, [n for n in complete_jetson_names() if n != "kernel-module-nvgpu"])
    write_modules_tarball(tmp_path, ["drivers/gpu/nvgpu/nvgpu", "net/bridge/br_netfilter"])
    _, findings = im.check_manifest(tmp_path, "gpu-k8s-image", MACHINE, [req.JETSON], JETSON_CUDA)
    assert missing(findings) == []
    assert next(f for f in findings if f.requirement.label == "kernel-module-nvgpu").satisfied_by == (
        "built into the kernel")
    assert im.builtin_modules(tmp_path, MACHINE) == {"nvgpu", "br_netfilter"}


def test_renamed_packages_are_found_through_pkgdata(tmp_path: Path) -> None:
    deploy, reverse = tmp_path / "deploy", tmp_path / "pkgdata" / "runtime-reverse"
    names = [n for n in complete_jetson_names() if n != "cuda-cudart"] + ["libcudart10.2"]
    write_manifest(deploy, names)
    reverse.mkdir(parents=True)
    (reverse / "libcudart10.2").symlink_to("../runtime/cuda-cudart")
    _, without = im.check_manifest(deploy, "gpu-k8s-image", MACHINE, [req.JETSON], JETSON_CUDA)
    assert missing(without) == ["cuda-cudart"]
    _, findings = im.check_manifest(deploy, "gpu-k8s-image", MACHINE, [req.JETSON], JETSON_CUDA, reverse)
    assert missing(findings) == []


def test_no_manifest_is_an_error_naming_the_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        im.check_manifest(tmp_path, "gpu-k8s-image", MACHINE, [req.JETSON], JETSON_CUDA)


def test_cuda_packages_come_from_the_packagegroup_pkgdata(tmp_path: Path) -> None:
    (tmp_path / "packagegroup-gpu-k8s").write_text(
        "PN: packagegroup-gpu-k8s\n"
        "RDEPENDS:packagegroup-gpu-k8s: docker tegra-libraries-cuda (>= 32.7.6) cuda-cudart cuda-libraries cudnn\n"
    )
    assert im.cuda_packages_from_pkgdata(tmp_path) == ["tegra-libraries-cuda", "cuda-cudart", "cuda-libraries",
                                                       "cudnn"]
    assert im.cuda_packages_from_pkgdata(tmp_path / "absent") == ["tegra-libraries-cuda", "cuda-cudart"]


def test_requirement_modules_are_the_ones_the_packagegroup_recommends() -> None:
    recommended = parse(GROUP).words("GPU_K8S_KERNEL_MODULES")
    assert sorted(recommended) == sorted(req.module_package(m) for m in req.K3S_KERNEL_MODULES)
    assert {"kernel-module-br-netfilter", "kernel-module-ip-set", "kernel-module-xt-set"} <= set(recommended)


def test_cuda_levels_are_the_ones_the_packagegroup_knows() -> None:
    in_recipe = [(name, tuple(pkgs.split())) for name, pkgs in re.findall(r"\('(\w+)', '([^']+)'\)", GROUP.read_text())]
    assert in_recipe == list(req.CUDA_LEVELS)
    assert parse(GROUP).value("GPU_K8S_CUDA") == "${GPU_K8S_DEFAULT_CUDA}"
    platform = parse(GROUP.parents[2] / "classes/gpu_k8s_platform.bbclass")
    assert platform.value("GPU_K8S_DEFAULT_CUDA", "tegra210") == req.DEFAULT_CUDA_LEVEL
    assert platform.value("GPU_K8S_DEFAULT_CUDA", "tegra") == req.DEFAULT_CUDA_LEVEL_R39
    with pytest.raises(ValueError, match="one of driver, runtime"):
        req.cuda_packages("everything")


@pytest.mark.parametrize(
    ("overrides", "arch", "classes"),
    [
        (["aarch64", "armv8a", "tegra210", "cuda", "tegra", "jetson-nano-devkit"], "aarch64", [req.JETSON]),
        (["x86-64", "genericx86-64"], "x86_64", [req.X86_64]),
        (["x86-64", "qemuall", "qemux86-64"], "x86_64", [req.X86_64, req.QEMU]),
    ],
)
def test_machine_classes_come_from_machineoverrides(overrides, arch, classes) -> None:
    assert req.machine_classes(overrides, arch) == classes


def test_the_k3s_kernel_module_list_joins_the_x86_requirements(tmp_path: Path) -> None:
    data = tmp_path / "k3s-kernel-requirements.yaml"
    data.write_text("x86_64_kernel_modules:\n  - kernel-module-br-netfilter\n  - kernel-module-xt-statistic\n")
    labels = [r.label for r in req.requirements_for([req.X86_64], k3s_requirements=data)]
    assert labels.count("kernel-module-br-netfilter") == 1
    statistic = next(r for r in req.requirements_for([req.X86_64], k3s_requirements=data)
                     if r.label == "kernel-module-xt-statistic")
    assert statistic.module == "xt_statistic" and "k3s loads xt_statistic" in statistic.why
    absent = [r.label for r in req.requirements_for([req.X86_64], k3s_requirements=tmp_path / "none.yaml")]
    assert "kernel-module-xt-statistic" not in absent


# ---- the x86-64 NVIDIA stack ------------------------------------------------------------

def test_nvidia_requirements_are_the_packages_the_packagegroup_adds() -> None:
    assert sorted(parse(GROUP).words("GPU_K8S_NVIDIA_PACKAGES")) == sorted(req.NVIDIA_PACKAGES)
    labels = {name for r in req.requirements_for([req.NVIDIA]) for name in r.names}
    assert set(req.NVIDIA_PACKAGES) <= labels
    assert "nvidia-driver-firmware" in labels, "nvidia.ko brings no GPU up without the GSP firmware"


def test_x86_manifest_without_the_driver_userspace_names_each_piece_and_why(tmp_path: Path) -> None:
    x86 = [req.X86_64, req.NVIDIA]
    names = ["docker-moby" if r.label == "docker" else r.names[0] for r in req.requirements_for(x86)]
    names = [n for n in names if n not in ("nvidia-driver-libcuda", "nvidia-driver-libnvidia-ml")]
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "gpu-k8s-image-genericx86-64.manifest").write_text("".join(f"{n} core2_64 1.0\n" for n in names))
    _, findings = im.check_manifest(deploy, "gpu-k8s-image", "genericx86-64", x86, [])
    assert missing(findings) == ["libnvidia-ml (nvidia-driver-libnvidia-ml)", "libcuda (nvidia-driver-libcuda)"]
    report = "\n".join(req.report_lines(findings))
    assert "MISSING  libnvidia-ml (nvidia-driver-libnvidia-ml): libnvidia-ml.so.1 (NVML)" in report
    assert "MISSING  libcuda (nvidia-driver-libcuda): libcuda.so.1" in report


def test_the_kernel_module_package_itself_satisfies_the_driver_requirement(tmp_path: Path) -> None:
    driver = next(r for r in req.requirements_for([req.NVIDIA]) if "nvidia-open-gpu-kernel-modules" in r.names)
    found = req.evaluate([driver], lambda name: (name, "") if name == "kernel-module-nvidia" else None)
    assert found[0].satisfied_by == "kernel-module-nvidia"


def test_whether_the_build_carried_the_nvidia_stack_comes_from_the_packagegroup_pkgdata(tmp_path: Path) -> None:
    (tmp_path / "packagegroup-gpu-k8s").write_text(
        "RDEPENDS:packagegroup-gpu-k8s: docker gpu-k8s-nvidia-cdi nvidia-driver-libcuda (>= 580.142)\n")
    assert im.nvidia_from_pkgdata(tmp_path, default=False) is True
    (tmp_path / "packagegroup-gpu-k8s").write_text("RDEPENDS:packagegroup-gpu-k8s: docker k3s-server\n")
    assert im.nvidia_from_pkgdata(tmp_path, default=True) is False
    assert im.nvidia_from_pkgdata(tmp_path / "absent", default=True) is True


def test_the_probe_s_knob_adds_the_nvidia_list() -> None:
    assert req.machine_classes(["x86-64", "genericx86-64"], "x86_64", nvidia=True) == [req.X86_64, req.NVIDIA]
