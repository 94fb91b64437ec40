"""The configs the layer installs are ones this plugin accepts, and say what each image needs."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_device_plugin.config import loader
from gpu_device_plugin.config.settings import Settings

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
