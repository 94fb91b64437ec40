"""NVML telemetry of two discrete GPUs through the fake NVML (nvidia-ml-py's names)."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest
from fake_nvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml, make_gpus
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.metrics import fields
from gpu_device_plugin.metrics import nvml as nvml_module
from gpu_device_plugin.metrics import tegra as tegra_module
from gpu_device_plugin.metrics.nvml import NvmlCollector


def two_gpus() -> FakeNvml:
    first, second = make_gpus(2)
    first = replace(first, gpu_util=87, memory_util=41, encoder_util=3, decoder_util=0, sm_clock_mhz=1410,
                            memory_clock_mhz=1215, temperature_c=61, memory_temperature_c=70, power_mw=245500,
                            energy_mj=9_876_543_210, pcie_replays=2, memory_used_mib=30000, memory_reserved_mib=561,
                            remapped_rows=(1, 0, 0, 0))
    # an older board: no HBM sensor, no row remapping, no v2 memory info, no encoder
    second = replace(second, name="Tesla T4", memory_mib=15360, gpu_util=0, memory_util=0, encoder_util=None,
                            sm_clock_mhz=300, memory_clock_mhz=405, temperature_c=38, power_mw=27345, energy_mj=None,
                            memory_used_mib=3, memory_reserved_mib=None)
    return FakeNvml([first, second], driver_version="580.105.08")


def collect(nvml: FakeNvml, xids=lambda gpu_id: None) -> list:
    gpus = NvmlBackend(nvml_module=nvml).discover()
    collector = NvmlCollector(gpus, nvml, xids)
    try:
        return collector.collect()
    finally:
        collector.close()


def test_every_field_nvml_answers_is_read_with_dcgms_units() -> None:
    first, _ = collect(two_gpus())
    assert first.values == {
        fields.GPU_UTIL: 87, fields.MEM_COPY_UTIL: 41, fields.ENC_UTIL: 3, fields.DEC_UTIL: 0,
        fields.SM_CLOCK: 1410, fields.MEM_CLOCK: 1215, fields.GPU_TEMP: 61, fields.MEMORY_TEMP: 70,
        fields.POWER_USAGE: 245.5,  # mW -> W
        fields.TOTAL_ENERGY_CONSUMPTION: 9_876_543_210,  # mJ, as DCGM
        fields.PCIE_REPLAY_COUNTER: 2,
        fields.FB_USED: 30000, fields.FB_RESERVED: 561, fields.FB_FREE: 40960 - 30000 - 561,  # MiB
        fields.CORRECTABLE_REMAPPED_ROWS: 1, fields.UNCORRECTABLE_REMAPPED_ROWS: 0, fields.ROW_REMAP_FAILURE: 0,
    }


def test_what_a_gpu_does_not_support_is_absent_not_zero() -> None:
    _, second = collect(two_gpus())
    for absent in (fields.ENC_UTIL, fields.MEMORY_TEMP, fields.TOTAL_ENERGY_CONSUMPTION, fields.FB_RESERVED,
                   fields.CORRECTABLE_REMAPPED_ROWS, fields.ROW_REMAP_FAILURE, fields.XID_ERRORS):
        assert absent not in second.values, absent
    # without nvmlDeviceGetMemoryInfo_v2, v1's "used" (reserve included) is what the driver says
    assert second.values[fields.FB_USED] == 3 and second.values[fields.FB_FREE] == 15360 - 3
    assert second.values[fields.POWER_USAGE] == 27.345


def test_labels_carry_nvml_pci_bus_id_driver_version_and_nvidia_index_device() -> None:
    first, second = collect(two_gpus())
    assert first.labels._asdict() == {
        "gpu": "0", "uuid": "GPU-00000000-1111-2222-3333-444444444444", "device": "nvidia0",
        "model_name": "NVIDIA A100-SXM4-40GB", "pci_bus_id": "00000000:3B:00.0", "driver_version": "580.105.08"}
    assert (second.labels.gpu, second.labels.device, second.labels.model_name, second.labels.pci_bus_id) == (
        "1", "nvidia1", "Tesla T4", "00000000:3C:00.0")


def test_xid_from_the_health_monitor_per_gpu() -> None:
    nvml = two_gpus()
    first_id = nvml.gpus[0].uuid
    first, second = collect(nvml, xids=lambda gpu_id: 79 if gpu_id == first_id else 0)
    assert first.values[fields.XID_ERRORS] == 79 and second.values[fields.XID_ERRORS] == 0


def test_one_session_for_the_collectors_life_ended_by_close() -> None:
    nvml = two_gpus()
    gpus = NvmlBackend(nvml_module=nvml).discover()
    before = nvml.init_calls
    collector = NvmlCollector(gpus, nvml)
    for _ in range(3):
        assert len(collector.collect()) == 2
    assert nvml.init_calls == before + 1
    collector.close()
    assert nvml.shutdown_calls == nvml.init_calls


def test_a_gpu_that_is_lost_reports_nothing_the_other_still_does() -> None:
    nvml = two_gpus()
    gpus = NvmlBackend(nvml_module=nvml).discover()
    collector = NvmlCollector(gpus, nvml)
    collector.collect()
    nvml.gpus[1].answering = False
    first, second = collector.collect()
    assert first.values[fields.GPU_UTIL] == 87 and second.values == {}
    collector.close()


def test_no_nvml_means_no_samples_and_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    nvml = two_gpus()
    gpus = NvmlBackend(nvml_module=nvml).discover()
    nvml.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    collector = NvmlCollector(gpus, nvml)
    with caplog.at_level(logging.WARNING):
        assert collector.collect() == [] and collector.collect() == []
    assert [r.getMessage() for r in caplog.records].count(
        "no NVML telemetry: NVIDIA kernel driver is not loaded (NVML: Driver Not Loaded): load it (modprobe "
        "nvidia) and check that the driver was built for the running kernel") == 1
    nvml.init_error = None  # the driver came back: the next scrape reads
    assert len(collector.collect()) == 2
    collector.close()


def hopper_with_nvlink() -> FakeNvml:
    [gpu] = make_gpus(1, name="NVIDIA H100 80GB HBM3", memory_mib=81559, compute_capability=(9, 0))
    gpu.gpm_rates = {1: 63.0, 5: 20.0, 10: 35.5, 20: 120.0, 21: 80.0}  # GPM: percent, MiB/s
    gpu.nvlink_kib_per_s = (3000.0, 1000.0)  # TX, RX
    return FakeNvml([gpu], driver_version="580.126.20")


def test_hopper_profiling_fields_come_from_gpm_over_the_time_between_scrapes() -> None:
    nvml = hopper_with_nvlink()
    collector = NvmlCollector(NvmlBackend(nvml_module=nvml).discover(), nvml)
    profiling = (fields.GR_ENGINE_ACTIVE, fields.PIPE_TENSOR_ACTIVE, fields.DRAM_ACTIVE, fields.PCIE_TX_BYTES,
                 fields.PCIE_RX_BYTES, fields.NVLINK_BANDWIDTH_TOTAL)
    [first] = collector.collect()
    assert not set(profiling) & set(first.values)  # one sample opens the interval: nothing measured yet
    nvml.advance(15)
    [second] = collector.collect()
    assert {name: second.values[name] for name in profiling} == {
        fields.GR_ENGINE_ACTIVE: 0.63, fields.PIPE_TENSOR_ACTIVE: 0.2, fields.DRAM_ACTIVE: 0.355,  # ratios, as DCGM
        fields.PCIE_TX_BYTES: 120 * 1024 * 1024, fields.PCIE_RX_BYTES: 80 * 1024 * 1024,  # B/s
        fields.NVLINK_BANDWIDTH_TOTAL: round(4000 / 1024, 3),  # MiB/s, both ways, all links
    }
    # 10 s idle then 10 s busy: the next scrape gives the mean over both, not the last instant
    nvml.gpus[0].gpm_rates = dict.fromkeys(nvml.gpus[0].gpm_rates, 0.0)
    nvml.gpus[0].nvlink_kib_per_s = (0.0, 0.0)
    nvml.advance(10)
    nvml.gpus[0].gpm_rates = {1: 100.0, 5: 50.0, 10: 80.0, 20: 10.0, 21: 10.0}
    nvml.gpus[0].nvlink_kib_per_s = (2048.0, 2048.0)
    nvml.advance(10)
    [third] = collector.collect()
    assert third.values[fields.GR_ENGINE_ACTIVE] == 0.5 and third.values[fields.PIPE_TENSOR_ACTIVE] == 0.25
    assert third.values[fields.NVLINK_BANDWIDTH_TOTAL] == 2.0
    samples = list(nvml.gpm_samples)
    collector.close()
    assert len(samples) == 2 and all(sample.freed for sample in samples)  # two reused, freed at close


def test_gpus_before_hopper_and_without_nvlink_have_no_profiling_or_nvlink_series() -> None:
    nvml = two_gpus()  # an A100 and a T4: no GPM, no NVLink here
    collector = NvmlCollector(NvmlBackend(nvml_module=nvml).discover(), nvml)
    for _ in range(3):
        for sample in collector.collect():
            assert not {name for name in sample.values if name.startswith("DCGM_FI_PROF_")}
            assert fields.NVLINK_BANDWIDTH_TOTAL not in sample.values
        nvml.advance(15)
    assert nvml.gpm_samples == []  # GPM was asked whether it exists, nothing allocated
    collector.close()


def test_the_collectors_use_nvidia_ml_pys_own_names_and_values() -> None:
    """Every NVML name the collectors call or read exists in nvidia-ml-py, with the fake's value."""
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is installed in the wrynose test venv only")
    import fake_nvml
    from gpu_device_plugin.metrics import nvml_rates

    sources = [Path(module.__file__).read_text() for module in (nvml_module, nvml_rates, tegra_module)]
    names = set()
    for source in sources:
        names |= set(re.findall(r"\bnvml\.((?:nvml|NVML|c_nvml)\w+)", source))
        names |= set(re.findall(r"[\"'](NVML_[A-Z0-9_]+|nvml[A-Z]\w+)[\"']", source))
    assert {"nvmlGpmMetricsGet", "nvmlGpmSampleGet", "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "nvmlDeviceGetUtilizationRates"} <= names
    missing = sorted(name for name in names if not hasattr(pynvml, name))
    assert not missing, f"not in nvidia-ml-py {getattr(pynvml, '__version__', '')}: {missing}"
    for name in names:
        if name.startswith("NVML_") and hasattr(fake_nvml, name):
            assert getattr(fake_nvml, name) == getattr(pynvml, name), name
    for name in dir(fake_nvml.FakeNvml):  # the fake offers nothing nvidia-ml-py does not
        if name.startswith(("nvml", "NVML", "c_nvml")):
            assert hasattr(pynvml, name), name
    for _, name, number, _ in nvml_rates.GPM_METRICS:
        assert getattr(pynvml, name) == number, name
    for name, number in nvml_rates.NVLINK_FIELDS:
        assert getattr(pynvml, name) == number, name
