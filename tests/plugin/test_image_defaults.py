"""The configs the layer installs are ones this plugin accepts, and say what each image needs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml
from gpu_device_plugin.cdi import handover
from gpu_device_plugin.config import loader
from gpu_device_plugin.config.settings import ConfigError, Settings
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.model import Gpu

FILES = Path(__file__).resolve().parents[2] / "meta-gpu-k8s" / "recipes-plugin" / "gpu-device-plugin" / "files"


def settings_for(relative: str) -> Settings:
    parsed = loader.parse_file((FILES / relative).read_text(), source=relative)
    assert parsed.warnings == (), f"{relative} has fields the plugin ignores: {parsed.warnings}"
    return loader.build({}, {}, parsed)


@pytest.mark.parametrize(("relative", "strategy"), [
    ("gpu-device-plugin.yaml", "auto"),
    ("tegra/gpu-device-plugin.yaml", "tegra"),
    ("qemuall/gpu-device-plugin.yaml", "simulated"),
])
def test_each_machine_default_loads_with_its_discovery_strategy(relative: str, strategy: str) -> None:
    settings = settings_for(relative)
    assert settings.device_discovery_strategy == strategy
    assert settings.fail_on_init_error is False, "a GPU-less node must not crash-loop the service"


def test_qemu_image_serves_two_simulated_gpus_for_the_smoke_test() -> None:
    assert settings_for("qemuall/gpu-device-plugin.yaml").simulated_gpus == 2


# ---- each machine's config against the runtime the same image carries -----------------------------

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
X86_RUNTIME = REPO / "meta-gpu-k8s/recipes-containers/nvidia-container-toolkit/files/config.toml"
# the Orin fixture's config.toml: meta-tegra's generated file with the drop-in's settings applied by
# nvidia-ctk 1.19.1 itself; Thor's image writes the same (one generate-config for every R39 machine)
R39_RUNTIME = FIXTURES / "jetson-orin-nano-r39/etc/nvidia-container-runtime/config.toml"
UUID = "GPU-6a3c9e2f-0d4b-4c1e-9a57-1b2c3d4e5f60"


def node(tmp_path: Path, fixture: str, runtime: Path | None) -> Path:
    """The fixture's tree with the runtime configuration the image has at run time."""
    root = tmp_path / fixture
    shutil.copytree(FIXTURES / fixture, root, symlinks=True)
    if runtime is not None:
        target = root / "etc/nvidia-container-runtime/config.toml"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        target.write_text(runtime.read_text())
    return root


def machine_gpus(fixture: str, root: Path) -> list[Gpu]:
    if fixture == "x86-nvidia-580":
        return NvmlBackend(str(root), FakeNvml([FakeGpu(UUID, name="NVIDIA L4")])).discover()
    if fixture == "simulated":
        return SimulatedBackend(2).discover()
    return TegraBackend(str(root)).discover()


MACHINES = [  # (image config, fixture tree, runtime config the image has, hand-over the runtime honours)
    ("gpu-device-plugin.yaml", "x86-nvidia-580", X86_RUNTIME, ("volume-mounts",)),
    ("tegra/gpu-device-plugin.yaml", "jetson-orin-nano-r39", R39_RUNTIME, ("volume-mounts",)),
    ("tegra/gpu-device-plugin.yaml", "jetson-agx-thor-r39", R39_RUNTIME, ("volume-mounts",)),
    ("tegra210/gpu-device-plugin.yaml", "jetson-nano", None, ("envvar",)),
    ("qemuall/gpu-device-plugin.yaml", "simulated", None, ("envvar",)),
]


@pytest.mark.parametrize(("relative", "fixture", "runtime", "honoured"), MACHINES)
def test_each_machines_explicit_config_reaches_the_runtime_that_machine_carries(
        tmp_path: Path, relative: str, fixture: str, runtime: Path | None, honoured: tuple[str, ...]) -> None:
    root = node(tmp_path, fixture, runtime) if fixture != "simulated" else tmp_path
    settings = settings_for(relative)._replace(host_root=str(root))
    gpus = machine_gpus(fixture, root)
    assert handover.resolve(settings, gpus).device_list_strategy == honoured
    # the built-in default ends where the image's explicit choice does
    assert handover.resolve(settings._replace(device_list_strategy=("auto",)), gpus).device_list_strategy == honoured


@pytest.mark.parametrize(("relative", "fixture", "runtime"), [
    ("tegra/gpu-device-plugin.yaml", "jetson-agx-thor-r39", None),  # the setup unit's defaults, drop-in not applied
    ("tegra210/gpu-device-plugin.yaml", "x86-nvidia-580", X86_RUNTIME),  # envvar on an isolating runtime
    ("gpu-device-plugin.yaml", "jetson-nano", None),  # volume mounts on the Nano's 3.1.0
])
def test_a_config_on_a_runtime_that_ignores_its_hand_over_is_refused_naming_the_fix(
        tmp_path: Path, relative: str, fixture: str, runtime: Path | None) -> None:
    root = node(tmp_path, fixture, runtime)
    settings = settings_for(relative)._replace(host_root=str(root))
    with pytest.raises(ConfigError, match="GPU pods would start without their GPU"):
        handover.resolve(settings, machine_gpus(fixture, root))
