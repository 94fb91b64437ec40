"""NVML telemetry of two discrete GPUs through the fake NVML (nvidia-ml-py's names)."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from fake_nvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml, make_gpus
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.metrics import fields
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
