"""The Prometheus text: dcgm-exporter's names, types, label names and order; pure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpu_device_plugin.metrics import fields, xids
from gpu_device_plugin.metrics.attribution import Holder, attribute
from gpu_device_plugin.metrics.collector import GpuLabels, GpuSample
from gpu_device_plugin.metrics.exposition import SHARE, escape, format_value
from gpu_device_plugin.metrics.exposition import render as render_attributed
from gpu_device_plugin.metrics.telemetry import hostname

A100 = GpuSample(GpuLabels(gpu="0", uuid="GPU-a", device="nvidia0", model_name="NVIDIA A100-SXM4-40GB",
                           pci_bus_id="00000000:3B:00.0", driver_version="580.105.08"),
                 {fields.GPU_UTIL: 87, fields.POWER_USAGE: 245.5, fields.XID_ERRORS: 0})
ORIN = GpuSample(GpuLabels(gpu="0", uuid="tegra-t234-igpu0", device="nvidia0", model_name="Orin (T234)",
                           driver_version="R39.2.0"), {fields.GPU_UTIL: 12.7})
# one exposition line: name{label="value",...} number
LABEL = r'[A-Za-z_][A-Za-z0-9_]*="(?:[^"\\\n]|\\.)*"'
SERIES = rf"^(DCGM_FI_[A-Z_]+|{SHARE})\{{({LABEL},)*{LABEL}\}} -?[0-9.e+-]+$"


def render(samples: list[GpuSample], holders: dict[str, list[Holder]], host: str) -> str:
    return render_attributed(attribute(samples, holders), host)


def test_a_series_has_dcgm_exporters_labels_in_its_order() -> None:
    text = render([A100], {}, "node-1")
    assert ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pci_bus_id="00000000:3B:00.0",device="nvidia0",'
            'modelName="NVIDIA A100-SXM4-40GB",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08"} 87') in text
    assert ("# HELP DCGM_FI_DEV_POWER_USAGE Power the GPU draws now (in W).\n"
            "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n") in text
    assert 'DCGM_FI_DEV_POWER_USAGE{gpu="0"' in text and text.rstrip().endswith('err_code="0",err_msg="No Error"} 0')


def test_every_line_is_valid_exposition_and_each_metric_has_help_and_type_once() -> None:
    text = render([A100, ORIN], {"GPU-a": [Holder("p", "ns", "c")]}, 'node "x"\\1')
    names = re.findall(r"^# TYPE (\S+) (gauge|counter)$", text, re.M)
    assert [n for n, _ in names] == [f.name for f in fields.METRICS if f.name in (
        fields.GPU_UTIL, fields.POWER_USAGE, fields.XID_ERRORS)] + [SHARE]
    for line in text.splitlines():
        assert line.startswith("# ") or re.match(SERIES, line), line


def test_a_platform_gpu_has_no_pci_bus_id_label_rather_than_an_empty_one() -> None:
    line = render([ORIN], {}, "orin-1").splitlines()[2]
    assert line == ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="tegra-t234-igpu0",device="nvidia0",modelName="Orin (T234)",'
                    'Hostname="orin-1",DCGM_FI_DRIVER_VERSION="R39.2.0"} 12.7')


def test_a_field_no_gpu_has_is_not_exported_at_all() -> None:
    text = render([ORIN], {}, "n")
    assert fields.POWER_USAGE not in text and fields.XID_ERRORS not in text
    assert render([], {}, "n") == ""


def test_a_held_gpu_carries_pod_namespace_container_and_an_unheld_one_stays_plain() -> None:
    other = A100._replace(labels=A100.labels._replace(gpu="1", uuid="GPU-b", device="nvidia1"))
    text = render([A100, other], {"GPU-a": [Holder("train-0", "ml", "main")]}, "n")
    util = [line for line in text.splitlines() if line.startswith(fields.GPU_UTIL + "{")]
    assert util == [
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pci_bus_id="00000000:3B:00.0",device="nvidia0",'
        'modelName="NVIDIA A100-SXM4-40GB",Hostname="n",DCGM_FI_DRIVER_VERSION="580.105.08",container="main",'
        'namespace="ml",pod="train-0"} 87',
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",pci_bus_id="00000000:3B:00.0",device="nvidia1",'
        'modelName="NVIDIA A100-SXM4-40GB",Hostname="n",DCGM_FI_DRIVER_VERSION="580.105.08"} 87']
    assert [line for line in text.splitlines() if line.startswith(SHARE + "{")] == [
        f'{SHARE}{{gpu="0",UUID="GPU-a",pci_bus_id="00000000:3B:00.0",device="nvidia0",'
        'modelName="NVIDIA A100-SXM4-40GB",Hostname="n",DCGM_FI_DRIVER_VERSION="580.105.08",container="main",'
        'namespace="ml",pod="train-0"} 1']


def test_a_shared_gpu_keeps_one_plain_series_and_each_replica_holder_gets_a_share() -> None:
    held = {"tegra-t234-igpu0": [Holder("a", "ns", "c1", "0"), Holder("b", "ns", "c2", "3")]}
    lines = [line for line in render([ORIN], held, "n").splitlines() if not line.startswith("#")]
    assert lines == [
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="tegra-t234-igpu0",device="nvidia0",modelName="Orin (T234)",'
        'Hostname="n",DCGM_FI_DRIVER_VERSION="R39.2.0"} 12.7',
        f'{SHARE}{{gpu="0",UUID="tegra-t234-igpu0",device="nvidia0",modelName="Orin (T234)",Hostname="n",'
        'DCGM_FI_DRIVER_VERSION="R39.2.0",container="c1",namespace="ns",pod="a",vgpu="0"} 0.5',
        f'{SHARE}{{gpu="0",UUID="tegra-t234-igpu0",device="nvidia0",modelName="Orin (T234)",Hostname="n",'
        'DCGM_FI_DRIVER_VERSION="R39.2.0",container="c2",namespace="ns",pod="b",vgpu="3"} 0.5']


def test_one_container_holding_replicas_of_a_gpu_owns_its_series_and_its_shares_add_to_one() -> None:
    held = {"tegra-t234-igpu0": [Holder("a", "ns", "c1", "0"), Holder("a", "ns", "c1", "1")]}
    lines = [line for line in render([ORIN], held, "n").splitlines() if not line.startswith("#")]
    assert lines[0].endswith('container="c1",namespace="ns",pod="a"} 12.7')  # no vgpu: it holds two
    assert [line.rsplit(",", 1)[1] for line in lines[1:]] == ['vgpu="0"} 0.5', 'vgpu="1"} 0.5']


def test_xid_series_carry_the_code_as_err_code_and_its_meaning_as_err_msg() -> None:
    sample = A100._replace(values={fields.XID_ERRORS: 79})
    assert render([sample], {}, "n").splitlines()[2].endswith(
        ',err_code="79",err_msg="GPU has fallen off the bus"} 79')
    assert xids.meaning(48) == "Double Bit ECC Error" and xids.meaning(13) == "Graphics Engine Exception"
    assert xids.meaning(0) == "No Error" and xids.meaning(10_000) == "Unknown Error"


def test_the_xid_catalogue_has_every_number_once_and_a_bad_line_is_named() -> None:
    assert sorted(xids.MEANINGS) == list(range(173))
    with pytest.raises(ValueError, match=r"Xid line 2 is not 'NUMBER meaning' .*'x13 Graphics'"):
        xids.parse("8 GPU stopped processing\nx13 Graphics\n")


def test_values_and_label_values_are_written_as_prometheus_reads_them() -> None:
    assert [format_value(v) for v in (87, 87.0, 245.5, 0.125, 9_876_543_210)] == [
        "87", "87", "245.5", "0.125", "9876543210"]
    assert escape('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_the_field_table_is_dcgm_exporters_default_set_with_its_types() -> None:
    by_name = {f.name: f for f in fields.FIELDS}
    assert len(by_name) == len(fields.FIELDS)
    counters = {f.name for f in fields.FIELDS if f.kind == "counter"}
    assert counters == {fields.TOTAL_ENERGY_CONSUMPTION, fields.PCIE_REPLAY_COUNTER,
                        fields.UNCORRECTABLE_REMAPPED_ROWS, fields.CORRECTABLE_REMAPPED_ROWS}
    # DCGM publishes field 449 as a rate (MiB/s); dcgm-exporter's list calls it a counter
    assert by_name[fields.NVLINK_BANDWIDTH_TOTAL].kind == "gauge"
    # only a vGPU guest has a licence: dropped (docs/telemetry.md says why)
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" not in by_name
    assert by_name[fields.DRIVER_VERSION].kind == "label" and fields.DRIVER_VERSION not in {
        f.name for f in fields.METRICS}
    constants = {value for name, value in vars(fields).items() if name.isupper() and isinstance(value, str)
                 and value.startswith("DCGM_")}
    assert constants <= set(by_name), constants - set(by_name)


def test_a_bad_counter_line_is_named() -> None:
    with pytest.raises(ValueError, match=r"counter line 2 is not .*'DCGM_FI_DEV_X, histogram, h'"):
        fields.parse_counters("# comment\nDCGM_FI_DEV_X, histogram, h\n")


def test_every_field_a_collector_writes_is_in_the_table() -> None:
    source = "\n".join(p.read_text() for p in (Path(fields.__file__).parent).glob("*.py") if p.name != "fields.py")
    used = set(re.findall(r"fields\.([A-Z_]+)\b", source)) - {"FIELDS", "METRICS"}
    assert used and all(getattr(fields, name) in {f.name for f in fields.FIELDS} for name in used)


def test_hostname_is_node_name_when_set_as_dcgm_exporter_does() -> None:
    assert hostname({"NODE_NAME": "orin-7"}) == "orin-7"
    assert hostname({}) not in ("", "orin-7")
