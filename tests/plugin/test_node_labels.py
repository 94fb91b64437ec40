"""`gpu-device-plugin node-labels`: the k3s drop-in that labels a node with the GPU it has."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from gpu_device_plugin.cli import main as cli
from gpu_device_plugin.cli.node_labels import drop_in, family, gpu_labels, label_value
from gpu_device_plugin.model import Gpu

FIXTURES = Path(__file__).parent / "fixtures"


pytestmark = pytest.mark.usefixtures("no_plugin_env")


def labels_in(path: Path) -> dict[str, str]:
    doc = yaml.safe_load(path.read_text())
    assert list(doc) == ["node-label+"]  # appended to config.yaml's labels, never replacing them
    return dict(item.split("=", 1) for item in doc["node-label+"])


@pytest.mark.parametrize(("text", "value"), [
    ("Tegra X1 (T210)", "Tegra-X1-T210"),
    ("NVIDIA GeForce RTX 3090", "NVIDIA-GeForce-RTX-3090"),
    ("  (weird) name!! ", "weird-name"),
    ("x" * 70, "x" * 63),
    ("a" * 62 + "-b", "a" * 62),  # cut at 63 leaves a trailing '-': dropped
    ("___", ""),
])
def test_values_are_valid_kubernetes_label_values(text: str, value: str) -> None:
    assert label_value(text) == value


def test_family_follows_compute_capability() -> None:
    assert [family(5, 3), family(7, 2), family(7, 5), family(8, 7), family(8, 9), family(4, 0)] == [
        "maxwell", "volta", "turing", "ampere", "ada-lovelace", ""]
    # Blackwell: data centre 10.x, Jetson Thor 11.0 (meta-tegra's TEGRA_CUDA_ARCHITECTURE 110), RTX 12.x
    assert [family(10, 0), family(11, 0), family(12, 0)] == ["blackwell"] * 3


def test_no_gpu_means_no_labels() -> None:
    assert gpu_labels([], "nvml") == {}


def test_nvml_gpus_are_counted_and_the_first_names_the_product() -> None:
    gpus = [Gpu(id=f"GPU-{i}", index=i, name="Tesla T4", backend="nvml", properties={"compute_capability": "7.5"})
            for i in (1, 0)]
    assert gpu_labels(gpus, "nvml") == {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.discovery": "nvml", "nvidia.com/gpu.compute.major": "7",
        "nvidia.com/gpu.compute.minor": "5", "nvidia.com/gpu.family": "turing"}
    assert yaml.safe_load(drop_in(gpu_labels(gpus, "nvml")))["node-label+"][0] == "nvidia.com/gpu.compute.major=7"


def test_jetson_nano_fixture_is_labelled_from_tegra_discovery(tmp_path: Path, capsys) -> None:
    out = tmp_path / "config.yaml.d" / "50-gpu-labels.yaml"
    code = cli.main(["node-labels", "--device-discovery-strategy", "tegra", "--host-root",
                     str(FIXTURES / "jetson-nano"), "--output", str(out)])
    assert code == 0
    assert labels_in(out) == {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "Tegra-X1-T210",
        "nvidia.com/gpu.discovery": "tegra", "nvidia.com/gpu.compute.major": "5",
        "nvidia.com/gpu.compute.minor": "3", "nvidia.com/gpu.family": "maxwell", "nvidia.com/gpu.chip": "T210",
        "nvidia.com/gpu.l4t": "R32.7.6", "nvidia.com/gpu.memory": "3956"}
    assert f"wrote 10 labels to {out}" in capsys.readouterr().out
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary file left behind


def test_nvml_gpus_carry_driver_and_cuda_versions_as_gpu_feature_discovery_names_them() -> None:
    gpu = Gpu(id="GPU-0", index=0, name="NVIDIA L4", backend="nvml", memory_mib=23034,
              properties={"compute_capability": "8.9", "driver_version": "580.105.08", "cuda_driver_version": "13.0"})
    labels = gpu_labels([gpu], "nvml")
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/cuda.")} == {
        "nvidia.com/cuda.driver-version.full": "580.105.08", "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.minor": "105", "nvidia.com/cuda.driver-version.revision": "08",
        "nvidia.com/cuda.driver.major": "580", "nvidia.com/cuda.driver.minor": "105",
        "nvidia.com/cuda.driver.rev": "08",
        "nvidia.com/cuda.runtime-version.full": "13.0", "nvidia.com/cuda.runtime-version.major": "13",
        "nvidia.com/cuda.runtime-version.minor": "0", "nvidia.com/cuda.runtime.major": "13",
        "nvidia.com/cuda.runtime.minor": "0"}
    assert labels["nvidia.com/gpu.memory"] == "23034" and labels["nvidia.com/gpu.family"] == "ada-lovelace"


def test_a_malformed_driver_version_gives_no_version_labels() -> None:
    gpu = Gpu(id="GPU-0", index=0, name="x", backend="nvml", properties={"driver_version": "r580 beta"})
    assert not [k for k in gpu_labels([gpu], "nvml") if "cuda" in k]


def test_simulated_gpus_follow_the_serve_settings(tmp_path: Path) -> None:
    out = tmp_path / "labels.yaml"
    assert cli.main(["--device-discovery-strategy", "simulated", "--simulated-gpus", "3",
                     "node-labels", "--output", str(out)]) == 0
    labels = labels_in(out)
    assert labels["nvidia.com/gpu.count"] == "3" and labels["nvidia.com/gpu.discovery"] == "simulated"


@pytest.mark.parametrize("fixture", ["raspberry-pi-4", "jetson-nano-no-nvgpu"])
def test_no_gpu_removes_the_drop_in_and_exits_zero(tmp_path: Path, fixture: str, capsys) -> None:
    out = tmp_path / "labels.yaml"
    out.write_text("node-label+:\n  - nvidia.com/gpu.present=true\n")  # from a boot with a GPU
    assert cli.main(["node-labels", "--host-root", str(FIXTURES / fixture), "--device-discovery-strategy",
                     "tegra", "--output", str(out)]) == 0
    assert not out.exists()
    assert f"removed {out}" in capsys.readouterr().out
    assert cli.main(["node-labels", "--host-root", str(FIXTURES / fixture), "--device-discovery-strategy",
                     "tegra", "--output", str(out)]) == 0  # nothing to remove is fine too


def test_bad_discovery_config_exits_2_and_touches_nothing(tmp_path: Path, capsys) -> None:
    out = tmp_path / "labels.yaml"
    out.write_text("kept\n")
    assert cli.main(["node-labels", "--device-discovery-strategy", "cuda", "--output", str(out)]) == 2
    assert "--device-discovery-strategy must be one of" in capsys.readouterr().err
    assert out.read_text() == "kept\n"


def test_unwritable_output_exits_1_with_one_line(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["node-labels", "--device-discovery-strategy", "simulated", "--simulated-gpus", "1",
                     "--output", str(blocker / "labels.yaml")]) == 1
    err = capsys.readouterr().err
    assert f"cannot update {blocker}/labels.yaml" in err and err.count("\n") == 1
