"""Jetson telemetry from the L4T files of a Nano (R32), an Orin Nano (R39) and an AGX Thor (R39).

The trees under fixtures/telemetry/ are modelled on each board's sysfs (their README says
where each path comes from); the values asserted here are the ones written there.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.metrics import fields
from gpu_device_plugin.metrics.tegra import Rail, TegraCollector, find_sources, memory_mib, read_values
from gpu_device_plugin.model import Gpu
from telemetry_trees import NANO, ORIN, THOR, jetson_gpu

NO_NVML = FakeNvml(library_missing=True)  # a Jetson image without pynvml or libnvidia-ml


def collect(root: Path, xid: int | None = None, nvml: FakeNvml = NO_NVML) -> tuple[Gpu, dict[str, float]]:
    gpu = jetson_gpu(root)
    [sample] = TegraCollector([gpu], str(root), xids=lambda gpu_id: xid, nvml_module=nvml).collect()
    assert sample.labels.uuid == gpu.id
    return gpu, dict(sample.values)


def test_nano_r32_reads_nvgpu_load_devfreq_the_gpu_thermal_zone_and_the_pom_5v_gpu_rail() -> None:
    gpu, values = collect(NANO)
    assert gpu.id == "tegra-t210-igpu0"
    assert values == {
        fields.GPU_UTIL: 45.3,  # load 453 per mille
        fields.SM_CLOCK: 921.6,  # devfreq 921600000 Hz
        fields.MEM_CLOCK: 1600,  # debugfs clk/emc/clk_rate 1600000000 Hz
        fields.GPU_TEMP: 34.5,  # GPU-therm 34500 millidegrees
        fields.POWER_USAGE: 1.021,  # in_power1_input (POM_5V_GPU) 1021 mW
        fields.FB_USED: (4051032 - 2621440) // 1024,  # MemTotal - MemAvailable
        fields.FB_FREE: 2621440 // 1024,  # MemAvailable
    }


def test_orin_nano_r39_has_no_gpu_only_rail_so_power_is_absent() -> None:
    _, values = collect(ORIN)
    assert values == {
        fields.GPU_UTIL: 12.7,
        fields.SM_CLOCK: 624.75,
        fields.MEM_CLOCK: 2133,  # debugfs bpmp/debug/clk/emc/rate
        fields.GPU_TEMP: 46.375,  # gpu-thermal
        fields.FB_USED: (7620360 - 6523112) // 1024,
        fields.FB_FREE: 6523112 // 1024,
    }
    assert find_sources(str(ORIN)).rail is None  # VDD_IN, VDD_CPU_GPU_CV, VDD_SOC: none is the GPU's alone


def test_thor_reads_the_gpc_devfreq_bwmgr_and_the_vdd_gpu_rail_and_without_nvml_no_load() -> None:
    gpu, values = collect(THOR)
    assert gpu.id == "tegra-t264-igpu0"
    assert values == {
        fields.SM_CLOCK: 1575,  # devfreq gpu-gpc-0
        fields.MEM_CLOCK: 4266,  # devfreq bwmgr
        fields.GPU_TEMP: 40.906,
        fields.POWER_USAGE: round(19.968 * 1.210, 3),  # hwmon in1_input x curr1_input (VDD_GPU)
        fields.FB_USED: (128791552 - 124482560) // 1024,
        fields.FB_FREE: 124482560 // 1024,
    }
    assert fields.GPU_UTIL not in values  # no nvgpu load file on Thor's driver, no NVML: absent, not 0


def test_thor_gpu_utilization_comes_from_nvml_as_its_open_driver_answers_it(
        caplog: pytest.LogCaptureFixture) -> None:
    gpu = jetson_gpu(THOR)
    assert gpu.properties["gpu_driver"] == "openrm-l4t"
    nvml = FakeNvml([FakeGpu(uuid=gpu.properties["uuid"], name="NVIDIA Thor", pci_bus_id="00000000:01:00.0",
                             gpu_util=37)])
    collector = TegraCollector([gpu], str(THOR), nvml_module=nvml)
    assert collector.collect()[0].values[fields.GPU_UTIL] == 37
    nvml.gpus[0].gpu_util = 81
    assert collector.collect()[0].values[fields.GPU_UTIL] == 81  # read again each scrape, one session
    assert nvml.init_calls == 1
    nvml.gpus[0].gpu_util = None  # a driver that does not support it: absent, the rest stay
    values = collector.collect()[0].values
    assert fields.GPU_UTIL not in values and values[fields.SM_CLOCK] == 1575
    collector.close()
    assert nvml.shutdown_calls == 1
    # the Orin's nvgpu has its load file: NVML is never asked there
    orin = FakeNvml(init_error=999)
    assert TegraCollector([jetson_gpu(ORIN)], str(ORIN), nvml_module=orin).collect()[0].values[fields.GPU_UTIL] == 12.7
    assert orin.init_calls == 0
    with caplog.at_level(logging.WARNING):
        lacking = TegraCollector([gpu], str(THOR), nvml_module=FakeNvml(library_missing=True))
        assert fields.GPU_UTIL not in lacking.collect()[0].values
        assert fields.GPU_UTIL not in lacking.collect()[0].values
    assert sum("no GPU utilization for Thor's GPU" in r.getMessage() for r in caplog.records) == 1


def test_labels_are_dcgm_exporters_with_the_l4t_release_as_driver_version() -> None:
    gpu = jetson_gpu(ORIN)
    [sample] = TegraCollector([gpu], str(ORIN)).collect()
    assert sample.labels._asdict() == {"gpu": "0", "uuid": "tegra-t234-igpu0", "device": "nvidia0",
                                       "model_name": "Orin (T234)", "pci_bus_id": "", "driver_version": "R39.2.0"}


def test_xid_comes_from_the_health_monitor_and_is_absent_when_nothing_watches() -> None:
    assert collect(NANO, xid=31)[1][fields.XID_ERRORS] == 31
    assert collect(NANO, xid=0)[1][fields.XID_ERRORS] == 0
    assert fields.XID_ERRORS not in collect(NANO, xid=None)[1]


def test_a_sensor_that_cannot_be_read_now_is_left_out_the_others_stay(tmp_path: Path) -> None:
    root = tmp_path / "thor"
    shutil.copytree(THOR, root, symlinks=True)
    collector = TegraCollector([jetson_gpu(THOR)], str(root), nvml_module=NO_NVML)
    assert fields.GPU_TEMP in collector.collect()[0].values
    # Thor's gpu-thermal answers an error while the GPU is power-gated: here, the file is gone
    (root / "sys/devices/virtual/thermal/thermal_zone1/temp").unlink()
    values = collector.collect()[0].values
    assert fields.GPU_TEMP not in values and values[fields.SM_CLOCK] == 1575


def test_values_are_read_again_on_each_collect_the_paths_are_found_once(tmp_path: Path) -> None:
    root = tmp_path / "nano"
    shutil.copytree(NANO, root, symlinks=True)
    collector = TegraCollector([jetson_gpu(NANO)], str(root))
    assert collector.collect()[0].values[fields.GPU_UTIL] == 45.3
    (root / "sys/devices/57000000.gpu/load").write_text("998\n")
    assert collector.collect()[0].values[fields.GPU_UTIL] == 99.8


def test_a_rail_mixing_the_gpu_with_other_blocks_is_never_taken_for_the_gpu(tmp_path: Path) -> None:
    root = tmp_path / "agx-orin"
    shutil.copytree(ORIN, root, symlinks=True)
    (root / "sys/class/hwmon/hwmon1/in2_label").write_text("VDD_GPU_SOC\n")  # the AGX Orin's rail
    assert find_sources(str(root)).rail is None
    (root / "sys/class/hwmon/hwmon1/in2_label").write_text("VDD_GPU\n")
    rail = find_sources(str(root)).rail
    assert rail is not None and rail.label == "VDD_GPU" and rail.current_ma.endswith("curr2_input")


def test_only_ina3221_hwmon_chips_are_rails() -> None:
    # Thor's INA238 (hwmon2, VIN) has no per-rail labels; the Orin's fan is hwmon0
    assert find_sources(str(THOR)).rail == Rail(
        "VDD_GPU", voltage_mv=str(THOR / "sys/class/hwmon/hwmon1/in1_input"),
        current_ma=str(THOR / "sys/class/hwmon/hwmon1/curr1_input"))


def test_shared_memory_used_and_free_come_from_memavailable() -> None:
    assert memory_mib("MemTotal: 2048 kB\nMemFree: 100 kB\nMemAvailable: 1024 kB\n") == (1, 1)
    assert memory_mib("MemTotal: 2048 kB\nMemFree: 100 kB\n") is None  # no MemAvailable: absent, not guessed


def test_a_tree_without_any_telemetry_file_gives_only_what_it_has(tmp_path: Path) -> None:
    assert read_values(find_sources(str(tmp_path))) == {}


@pytest.mark.parametrize("root", [NANO, ORIN, THOR])
def test_the_plugins_own_discovery_finds_the_same_gpu_on_the_trees(root: Path) -> None:
    [gpu] = TegraBackend(str(root)).discover()
    assert gpu.backend == "tegra" and gpu.properties["l4t"].startswith(("R32", "R39"))
