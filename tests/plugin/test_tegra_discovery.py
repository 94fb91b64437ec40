"""Tegra discovery on fixture trees of real boards."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_device_plugin.discovery.base import DiscoveryError
from gpu_device_plugin.discovery.tegra import TegraBackend

FIXTURES = Path(__file__).parent / "fixtures"


def backend(name: str) -> TegraBackend:
    return TegraBackend(str(FIXTURES / name))


def test_jetson_nano_is_detected_from_every_soc_signal() -> None:
    probe = backend("jetson-nano").probe()
    assert probe.usable
    assert "NVIDIA Jetson Nano Developer Kit" in probe.reason and "T210" in probe.reason
    joined = "\n".join(probe.evidence)
    for signal in ("tegra_fuse chip id 33 = T210", "soc0 family Tegra210", "nvidia,tegra210", "R32.7.6"):
        assert signal in joined


def test_jetson_nano_reports_one_igpu_with_chip_release_and_device_nodes() -> None:
    [gpu] = backend("jetson-nano").discover()
    assert gpu.id == "tegra-t210-igpu0"
    assert gpu.index == 0 and gpu.backend == "tegra"
    assert gpu.name == "Tegra X1 (T210)"
    assert gpu.properties["chip"] == "T210"
    assert gpu.properties["l4t"] == "R32.7.6"
    assert gpu.properties["compute_capability"] == "5.3"
    assert gpu.memory_mib == 4051032 // 1024
    assert "/dev/nvhost-gpu" in gpu.device_nodes and "/dev/nvmap" in gpu.device_nodes
    assert "/dev/null" not in gpu.device_nodes
    assert all(node.startswith("/dev/") and "fixtures" not in node for node in gpu.device_nodes)


def test_discovery_id_is_stable_across_rescans() -> None:
    assert backend("jetson-nano").discover() == backend("jetson-nano").discover()


def test_raspberry_pi_is_not_mistaken_for_a_jetson() -> None:
    probe = backend("raspberry-pi-4").probe()
    assert not probe.usable
    assert "no Tegra SoC" in probe.reason
    with pytest.raises(DiscoveryError, match="no Tegra SoC"):
        backend("raspberry-pi-4").discover()


def test_l4t_files_without_a_tegra_soc_are_not_a_jetson() -> None:
    probe = backend("x86-with-l4t-files").probe()
    assert not probe.usable
    assert "R32.7.6" in probe.reason and "no Tegra SoC" in probe.reason


def test_tegra_without_gpu_nodes_names_the_missing_driver() -> None:
    with pytest.raises(DiscoveryError, match=r"modprobe nvgpu"):
        backend("jetson-nano-no-nvgpu").discover()


def test_unknown_chip_id_still_detects_tegra_from_the_device_tree(tmp_path: Path) -> None:
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/compatible").write_bytes(b"nvidia,p3737-0000\0nvidia,tegra234\0")
    (tmp_path / "sys/module/tegra_fuse/parameters").mkdir(parents=True)
    (tmp_path / "sys/module/tegra_fuse/parameters/tegra_chip_id").write_text("99\n")
    (tmp_path / "dev/nvgpu/igpu0").mkdir(parents=True)
    (tmp_path / "dev/nvgpu/igpu0/ctrl").write_text("")
    [gpu] = TegraBackend(str(tmp_path)).discover()
    assert gpu.properties["chip"] == "T234"
    assert gpu.device_nodes == ("/dev/nvgpu/igpu0/ctrl",)
