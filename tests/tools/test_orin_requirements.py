"""check-image / build for a Jetson Orin: the tegra234 list (meta-tegra wrynose's out-of-tree
GPU driver, toolkit 1.19 in CSV mode) applies instead of the Nano's, from the same closure
the probe reports, and every missing piece says why it matters."""

from __future__ import annotations

from tools.image import build, check_image
from tools.image import closure as ic
from tools.image import requirements as req

# MACHINEOVERRIDES of jetson-orin-nano-devkit-nvme as meta-tegra wrynose's machine includes
# compose them (tegra-common.inc prepends cuda:tegra:, soc-family.inc tegra234:).
ORIN_OVERRIDES = ["aarch64", "armv8-2a", "cuda", "tegra", "tegra234", "orin-nano", "jetson-orin-nano-devkit",
                  "jetson-orin-nano-devkit-nvme"]
NANO_OVERRIDES = ["aarch64", "armv8a", "tegra210", "cuda", "tegra", "jetson-nano-devkit"]
COMMON = ["docker-moby", "k3s", "k3s-server", "gpu-device-plugin", "python3-hpack",
          "python3-pyyaml", "gpu-k8s-docker-config"]
ORIN_GPU = ["nv-kernel-module-nvgpu", "nv-kernel-module-nvmap", "nv-kernel-module-host1x", "tegra-firmware-tegra234",
            "tegra-configs-udev", "tegra-libraries-cuda", "nvidia-container-toolkit", "libnvidia-container-tools",
            "tegra-configs-container-csv", "tegra-container-passthrough", "gpu-k8s-nvidia-runtime-config",
            "nv-tegra-release", "cuda-cudart"]
# A/B updates (meta-mender-tegra's native scheme): tools/image/requirements.py _jetson_orin_updates
ORIN_UPDATES = ["mender-update", "tegra-rootfs-update-module", "tegra-redundant-boot-base", "tegra-uefi-capsules",
                "gpu-k8s-data", "gpu-k8s-update", "gpu-k8s-watchdog"]


def result(installed: list[str], overrides: list[str]) -> check_image.ProbeResult:
    closure = ic.Closure()
    for name in installed:
        closure.installed[name] = ic.Installed(name, name, ic.BY_PACKAGE, name, ic.IMAGE, ic.IMAGE)
    return check_image.ProbeResult.from_json({
        "image": "gpu-k8s-image", "machine": overrides[-1], "machineoverrides": overrides,
        "target_arch": "aarch64", "cuda_level": "runtime", "cuda_packages": ["tegra-libraries-cuda", "cuda-cudart"],
        "closure": closure.to_json()})


def test_orin_overrides_select_the_orin_list_and_the_nanos_do_not() -> None:
    assert req.machine_classes(ORIN_OVERRIDES, "aarch64") == [req.JETSON, req.JETSON_ORIN]
    assert req.machine_classes(NANO_OVERRIDES, "aarch64") == [req.JETSON]


def test_a_complete_orin_closure_passes() -> None:
    findings = check_image.closure_findings(result(COMMON + ORIN_GPU + ORIN_UPDATES, ORIN_OVERRIDES))
    assert [f.requirement.label for f in findings if not f.ok] == []
    labels = {f.requirement.label for f in findings}
    # The Nano's R32 pieces are not asked of an Orin: its toolkit package holds the runtime.
    assert not labels & {"kernel-module-nvgpu", "nvidia-container-runtime", "tegra-libraries-cuda-container-csv"}


def test_the_nanos_closure_on_an_orin_misses_the_orin_driver_and_says_why() -> None:
    nano_gpu = ["kernel-module-nvgpu", "tegra-configs-udev", "tegra-libraries-cuda", "nvidia-container-runtime",
                "nvidia-container-toolkit", "libnvidia-container-tools", "tegra-libraries-cuda-container-csv",
                "cuda-cudart"]
    probe = result(COMMON + nano_gpu + ORIN_UPDATES, ORIN_OVERRIDES)
    findings = check_image.closure_findings(probe)
    missing = [f.requirement.label for f in findings if not f.ok]
    assert missing == ["nv-kernel-module-nvgpu", "nv-kernel-module-nvmap", "nv-kernel-module-host1x",
                       "tegra-firmware-tegra234", "tegra-configs-container-csv", "tegra-container-passthrough",
                       "gpu-k8s-nvidia-runtime-config", "nv-tegra-release"]
    report = "\n".join(check_image.report(probe, findings))
    assert "MISSING  nv-kernel-module-nvgpu: the Orin GPU driver, built out of tree by nvidia-kernel-oot" in report
    assert "(jetson, jetson-orin)" in report and "8 of 27 required pieces missing" in report


def test_a_builtin_nvgpu_satisfies_the_driver_after_a_build() -> None:
    findings = req.evaluate(req.requirements_for([req.JETSON, req.JETSON_ORIN]), lambda name: None,
                            builtin_modules={"nvgpu"})
    assert next(f for f in findings if f.requirement.label == "nv-kernel-module-nvgpu").satisfied_by == (
        "built into the kernel")


def test_every_orin_machine_is_checked_against_the_orin_list() -> None:
    for name in ("jetson-orin-nano", "jetson-orin-nano-sd", "jetson-agx-orin"):
        target = build.MACHINES[name]
        assert target.kinds == (req.JETSON, req.JETSON_ORIN), name
        assert target.kas_file.split(":")[0] == "kas/jetson-orin-nano.yml"
    assert build.MACHINES["jetson-nano"].kinds == (req.JETSON,)


def test_an_orin_closure_without_the_updater_misses_it_and_says_why() -> None:
    probe = result(COMMON + ORIN_GPU, ORIN_OVERRIDES)
    findings = check_image.closure_findings(probe)
    assert [f.requirement.label for f in findings if not f.ok] == ORIN_UPDATES
    report = "\n".join(check_image.report(probe, findings))
    assert "MISSING  tegra-rootfs-update-module: the tegra-rootfs-image update module" in report
