"""NvmlBackend against the fake NVML module and fixture trees."""

from __future__ import annotations

import builtins
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_nvml import (
    NVML_BRAND_GEFORCE,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_UNKNOWN,
    FakeGpu,
    FakeNvml,
    make_gpus,
)
from gpu_device_plugin.discovery.base import DiscoveryError
from gpu_device_plugin.discovery.nvml import NvmlBackend, sysfs_pci_address


def _dev_tree(root: Path, *names: str) -> None:
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / "dev" / name).write_text("")


def test_discover_reports_one_gpu_per_nvml_device_with_uuid_index_name_and_memory(tmp_path: Path) -> None:
    nvml = FakeNvml(make_gpus(2, name="NVIDIA H100 80GB HBM3", memory_mib=81559))
    gpus = NvmlBackend(str(tmp_path), nvml).discover()
    assert [(g.id, g.index, g.name, g.memory_mib, g.backend) for g in gpus] == [
        ("GPU-00000000-1111-2222-3333-444444444444", 0, "NVIDIA H100 80GB HBM3", 81559, "nvml"),
        ("GPU-00000001-1111-2222-3333-444444444444", 1, "NVIDIA H100 80GB HBM3", 81559, "nvml"),
    ]


def test_discover_reports_properties_compute_capability_driver_bus_id_and_brand(tmp_path: Path) -> None:
    nvml = FakeNvml(
        [FakeGpu("GPU-a", compute_capability=(8, 9), pci_bus_id="00000000:C1:00.0",
                 brand=NVML_BRAND_GEFORCE)],
        driver_version="560.35.03",
    )
    (gpu,) = NvmlBackend(str(tmp_path), nvml).discover()
    assert gpu.properties == {
        "driver_version": "560.35.03",
        "cuda_driver_version": "12.4",
        "pci_bus_id": "0000:c1:00.0",
        "compute_capability": "8.9",
        "brand": "geforce",
    }


def test_device_nodes_are_the_gpu_minor_and_control_node_and_the_others_optional(tmp_path: Path) -> None:
    _dev_tree(tmp_path, "nvidiactl")  # nvidia-uvm appears on the first CUDA use: Allocate checks, not discovery
    nvml = FakeNvml([FakeGpu("GPU-a", minor=3)])
    (gpu,) = NvmlBackend(str(tmp_path), nvml).discover()
    assert gpu.device_nodes == ("/dev/nvidia3", "/dev/nvidiactl")
    assert gpu.optional_nodes == ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


def test_gpu_without_a_minor_number_gets_no_gpu_node_but_keeps_control_nodes(tmp_path: Path) -> None:
    (gpu,) = NvmlBackend(str(tmp_path), FakeNvml([FakeGpu("GPU-a", minor=None)])).discover()
    assert gpu.device_nodes == ("/dev/nvidiactl",)


def test_numa_node_comes_from_nvml_when_it_answers(tmp_path: Path) -> None:
    (gpu,) = NvmlBackend(str(tmp_path), FakeNvml([FakeGpu("GPU-a", numa_node=1)])).discover()
    assert gpu.numa_node == 1


@pytest.mark.parametrize("has_function", [True, False], ids=["query-not-supported", "old-nvidia-ml-py"])
def test_numa_node_falls_back_to_sysfs_with_a_four_digit_lowercase_domain(
    tmp_path: Path, has_function: bool
) -> None:
    device_dir = tmp_path / "sys/bus/pci/devices/0000:3b:00.0"
    device_dir.mkdir(parents=True)
    (device_dir / "numa_node").write_text("1\n")
    nvml = FakeNvml([FakeGpu("GPU-a", numa_node=None, pci_bus_id="00000000:3B:00.0")],
                    has_numa_function=has_function)
    (gpu,) = NvmlBackend(str(tmp_path), nvml).discover()
    assert gpu.numa_node == 1


def test_numa_node_minus_one_in_sysfs_means_unknown(tmp_path: Path) -> None:
    device_dir = tmp_path / "sys/bus/pci/devices/0000:3b:00.0"
    device_dir.mkdir(parents=True)
    (device_dir / "numa_node").write_text("-1\n")
    nvml = FakeNvml([FakeGpu("GPU-a", numa_node=None)])
    (gpu,) = NvmlBackend(str(tmp_path), nvml).discover()
    assert gpu.numa_node is None


def test_numa_node_is_unknown_when_neither_nvml_nor_sysfs_says(tmp_path: Path) -> None:
    (gpu,) = NvmlBackend(str(tmp_path), FakeNvml([FakeGpu("GPU-a", numa_node=None)])).discover()
    assert gpu.numa_node is None


@pytest.mark.parametrize(
    ("nvml_bus_id", "sysfs_name"),
    [("00000000:3B:00.0", "0000:3b:00.0"), ("00000001:01:00.0", "0001:01:00.0"),
     ("00010000:00:1F.0", "10000:00:1f.0"), ("0000:65:00.0", "0000:65:00.0")],
)
def test_sysfs_pci_address_matches_the_kernel_naming(nvml_bus_id: str, sysfs_name: str) -> None:
    assert sysfs_pci_address(nvml_bus_id) == sysfs_name


def test_mig_enabled_gpu_is_reported_with_mig_enabled_and_others_without(tmp_path: Path) -> None:
    gpus = make_gpus(2)
    gpus[1].mig_mode = (1, 1)
    found = NvmlBackend(str(tmp_path), FakeNvml(gpus)).discover()
    assert [g.mig_enabled for g in found] == [False, True]


def test_mig_pending_but_not_current_is_not_mig_enabled(tmp_path: Path) -> None:
    (gpu,) = NvmlBackend(str(tmp_path), FakeNvml([FakeGpu("GPU-a", mig_mode=(0, 1))])).discover()
    assert gpu.mig_enabled is False


def test_gpu_without_mig_support_is_not_mig_enabled(tmp_path: Path) -> None:
    (gpu,) = NvmlBackend(str(tmp_path), FakeNvml([FakeGpu("GPU-a", mig_mode=None)])).discover()
    assert gpu.mig_enabled is False


def test_discover_calls_nvml_shutdown_once_for_its_init(tmp_path: Path) -> None:
    nvml = FakeNvml(make_gpus(1))
    NvmlBackend(str(tmp_path), nvml).discover()
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)


def test_a_gpu_nvml_cannot_read_is_skipped_and_the_others_are_reported(tmp_path: Path) -> None:
    gpus = make_gpus(3)
    gpus[1].answering = False
    found = NvmlBackend(str(tmp_path), FakeNvml(gpus)).discover()
    assert [g.index for g in found] == [0, 2]


def test_library_missing_gives_one_line_naming_the_library_and_the_fix(tmp_path: Path) -> None:
    nvml = FakeNvml(library_missing=True)
    with pytest.raises(DiscoveryError) as info:
        NvmlBackend(str(tmp_path), nvml).discover()
    message = str(info.value)
    assert "\n" not in message
    assert "libnvidia-ml.so.1 not found" in message
    assert "install the NVIDIA driver" in message and "nvidia runtime" in message


def test_missing_pynvml_module_gives_a_clear_error_naming_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(DiscoveryError, match=r"nvidia-ml-py.*not installed: install nvidia-ml-py"):
        NvmlBackend(str(tmp_path)).discover()


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (NVML_ERROR_NO_PERMISSION, "run the plugin as root"),
        (NVML_ERROR_LIB_RM_VERSION_MISMATCH, "versions differ: reboot"),
        (NVML_ERROR_UNKNOWN, "NVML failed to initialise (Unknown Error)"),
    ],
)
def test_init_failure_gives_one_line_with_cause_and_fix(tmp_path: Path, code: int, expected: str) -> None:
    with pytest.raises(DiscoveryError) as info:
        NvmlBackend(str(tmp_path), FakeNvml(make_gpus(1), init_error=code)).discover()
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_probe_is_usable_for_discrete_gpus_and_lists_them_as_evidence(tmp_path: Path) -> None:
    probe = NvmlBackend(str(tmp_path), FakeNvml(make_gpus(2, name="Tesla T4"))).probe()
    assert probe.usable, probe.reason
    assert probe.evidence == ("nvml: GPU 0: Tesla T4 (discrete)", "nvml: GPU 1: Tesla T4 (discrete)")


@pytest.mark.parametrize("name", ["Orin (nvgpu)", "NVIDIA Thor"])
def test_probe_leaves_an_integrated_gpu_to_the_tegra_backend(tmp_path: Path, name: str) -> None:
    probe = NvmlBackend(str(tmp_path), FakeNvml([FakeGpu("GPU-igpu", name=name)])).probe()
    assert not probe.usable
    assert "tegra backend" in probe.reason
    assert probe.evidence == (f"nvml: GPU 0: {name} (integrated)",)


def test_probe_is_not_usable_and_explains_when_the_library_is_missing(tmp_path: Path) -> None:
    probe = NvmlBackend(str(tmp_path), FakeNvml(library_missing=True)).probe()
    assert not probe.usable
    assert "libnvidia-ml.so.1 not found" in probe.reason


def test_probe_is_not_usable_when_nvml_reports_no_gpus(tmp_path: Path) -> None:
    nvml = FakeNvml([])
    probe = NvmlBackend(str(tmp_path), nvml).probe()
    assert not probe.usable and "no GPUs" in probe.reason
    assert nvml.shutdown_calls == nvml.init_calls == 1


def test_probe_never_raises_even_when_nvml_misbehaves(tmp_path: Path) -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise RuntimeError("segfault averted")

    probe = NvmlBackend(str(tmp_path), Broken(make_gpus(1))).probe()
    assert not probe.usable and "segfault averted" in probe.reason


def test_importing_the_nvml_modules_does_not_import_pynvml() -> None:
    code = (
        "import sys, gpu_device_plugin.discovery.nvml, gpu_device_plugin.health.nvml; "
        "sys.exit('pynvml imported' if 'pynvml' in sys.modules else 0)"
    )
    src = Path(__file__).resolve().parents[2] / "plugin" / "src"
    result = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(src)},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr or result.stdout
