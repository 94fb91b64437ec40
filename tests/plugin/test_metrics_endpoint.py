"""/metrics of the running daemon: the DCGM names with their labels and the fixture's values for
a Nano, an Orin and a Thor tree and for two NVML GPUs, the pod holding a GPU (from a
PodResources server on the kubelet's socket) on that GPU's series, and nothing made up."""

from __future__ import annotations

import os
import re
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_nvml import FakeNvml, make_gpus
from gpu_device_plugin.cli import main as cli
from gpu_device_plugin.config.settings import Settings, TimeSlicing
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.health.nvml import NvmlHealthMonitor
from gpu_device_plugin.health.tegra import TegraHealthMonitor
from gpu_device_plugin.session.daemon import Daemon
from helpers import RunningDaemon, short_tempdir, wait_until
from podresources_double import Container, Pod, PodResourcesDouble
from telemetry_trees import NANO, ORIN, THOR, jetson_gpu


@pytest.fixture
def kubelet_root() -> Iterator[Path]:
    """A kubelet root: device-plugins/ for our socket, pod-resources/ for the PodResources one."""
    path = Path(short_tempdir())
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pod_resources(kubelet_root: Path) -> Iterator[PodResourcesDouble]:
    double = PodResourcesDouble(str(kubelet_root / "pod-resources" / "kubelet.sock")).start()
    yield double
    double.stop()


def settings_for(kubelet_root: Path, **overrides: object) -> Settings:
    return Settings(kubelet_socket=str(kubelet_root / "device-plugins" / "kubelet.sock"),
                    metrics_address="127.0.0.1:0")._replace(**overrides)  # type: ignore[arg-type]


def scrape(daemon: Daemon, path: str = "/metrics") -> str:
    assert wait_until(lambda: daemon.status_port is not None), "the /metrics listener never started"
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.status_port}{path}", timeout=5) as response:
        return response.read().decode()


def series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def value(line: str) -> str:
    return line.rsplit(" ", 1)[1]


JETSONS = {  # tree -> (GPU ID, expected values of the fields the tree has, fields it must not have)
    "nano": (NANO, "tegra-t210-igpu0", {"GPU_UTIL": "45.3", "SM_CLOCK": "921.6", "MEM_CLOCK": "1600",
                                         "GPU_TEMP": "34.5", "POWER_USAGE": "1.021", "FB_FREE": "2560",
                                         "FB_USED": "1396", "XID_ERRORS": "0"},
             ("MEMORY_TEMP", "TOTAL_ENERGY_CONSUMPTION", "FB_RESERVED", "ENC_UTIL")),
    "orin": (ORIN, "tegra-t234-igpu0", {"GPU_UTIL": "12.7", "SM_CLOCK": "624.75", "MEM_CLOCK": "2133",
                                         "GPU_TEMP": "46.375", "FB_FREE": "6370", "FB_USED": "1071",
                                         "XID_ERRORS": "0"},
             ("POWER_USAGE", "TOTAL_ENERGY_CONSUMPTION", "MEMORY_TEMP")),
    "thor": (THOR, "tegra-t264-igpu0", {"SM_CLOCK": "1575", "MEM_CLOCK": "4266", "GPU_TEMP": "40.906",
                                         "POWER_USAGE": "24.161", "FB_FREE": "121565", "FB_USED": "4208",
                                         "XID_ERRORS": "0"},
             ("GPU_UTIL", "TOTAL_ENERGY_CONSUMPTION", "MEMORY_TEMP")),
}


@pytest.mark.parametrize("board", list(JETSONS))
def test_a_jetson_serves_dcgm_names_from_its_files_and_the_pod_holding_its_gpu(
        board: str, kubelet_root: Path, pod_resources: PodResourcesDouble, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", f"{board}-1")
    root, gpu_id, expected, absent = JETSONS[board]
    gpu = jetson_gpu(root)
    assert gpu.id == gpu_id
    pod_resources.pods = [Pod("infer-0", "vision", [Container("model", {"nvidia.com/gpu": [gpu_id]})]),
                          Pod("web", "default", [Container("nginx", {})])]
    (tmp_path / "kmsg").write_text("")
    monitor = TegraHealthMonitor(str(root), str(tmp_path / "kmsg"), env={})
    daemon = Daemon(settings_for(kubelet_root, host_root=str(root), device_discovery_strategy="tegra"), [gpu],
                    monitor, environ={})
    with RunningDaemon(daemon):
        assert wait_until(lambda: 'pod="infer-0"' in scrape(daemon))  # the kubelet's answer, read beside the scrape
        text = scrape(daemon)
    assert (f'gpu_device_plugin_devices{{resource="nvidia.com/gpu",health="healthy",Hostname="{board}-1"}} 1'
            in text)  # the plugin's own, with the node's name as the GPUs' series carry it
    labels = (f'gpu="0",UUID="{gpu_id}",device="nvidia0",modelName="{gpu.name}",Hostname="{board}-1",'
              f'DCGM_FI_DRIVER_VERSION="{gpu.properties["l4t"]}",container="model",')
    for field, number in expected.items():
        name = f"DCGM_FI_DEV_{field}"
        extra = f'err_code="{number}",err_msg="No Error",' if field == "XID_ERRORS" else ""  # sorted by name
        assert series(text, name) == [f'{name}{{{labels}{extra}namespace="vision",pod="infer-0"}} {number}'], (
            name, series(text, name))
        assert f"# TYPE {name} " in text
    for field in absent:
        assert f"DCGM_FI_DEV_{field}" not in text, field
    assert "pci_bus_id" not in text  # a platform GPU has no PCI address: no label, not an empty one
    assert series(text, "gpu_device_plugin_pod_gpu_share") == [
        f'gpu_device_plugin_pod_gpu_share{{{labels}namespace="vision",pod="infer-0"}} 1']
    assert f'gpu_device_plugin_pod_resources_up{{Hostname="{board}-1"}} 1' in text


def test_two_nvml_gpus_serve_nvmls_values_and_a_time_sliced_gpu_one_series_with_a_share_per_container(
        kubelet_root: Path, pod_resources: PodResourcesDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = make_gpus(2)
    first.gpu_util, first.power_mw, first.memory_used_mib, first.energy_mj = 87, 245500, 30000, 1234567
    second.name = "Tesla T4"
    second.gpu_util, second.energy_mj, second.memory_reserved_mib = 3, None, None
    nvml = FakeNvml([first, second], driver_version="580.105.08")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # what `import pynvml` gives the collector
    gpus = NvmlBackend(nvml_module=nvml).discover()
    pod_resources.pods = [Pod("a", "ml", [Container("c1", {"nvidia.com/gpu": [f"{second.uuid}::0"]})]),
                          Pod("b", "ml", [Container("c2", {"nvidia.com/gpu": [f"{second.uuid}::1"]})])]
    monitor = NvmlHealthMonitor(nvml, env={}, wait_timeout_ms=20, idle_wait_ms=20)
    daemon = Daemon(settings_for(kubelet_root, time_slicing=TimeSlicing(replicas=2)), gpus, monitor, environ={})
    with RunningDaemon(daemon):
        assert wait_until(lambda: monitor.last_xid(second.uuid) == 0)
        nvml.emit_xid(first.uuid, 43)
        assert wait_until(lambda: monitor.last_xid(first.uuid) == 43)
        assert wait_until(lambda: 'pod="b"' in scrape(daemon))
        text = scrape(daemon)
    util = series(text, "DCGM_FI_DEV_GPU_UTIL")
    assert util == [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{first.uuid}",pci_bus_id="00000000:3B:00.0",device="nvidia0",'
        f'modelName="NVIDIA A100-SXM4-40GB",Hostname="{os.uname().nodename}",DCGM_FI_DRIVER_VERSION="580.105.08"}} 87',
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="{second.uuid}",pci_bus_id="00000000:3C:00.0",device="nvidia1",'
        f'modelName="Tesla T4",Hostname="{os.uname().nodename}",DCGM_FI_DRIVER_VERSION="580.105.08"}} 3']
    # one series per GPU, whole: the time-sliced T4's two containers are in the share series
    assert [value(line) for line in series(text, "DCGM_FI_DEV_POWER_USAGE")] == ["245.5", "62"]
    assert [value(line) for line in series(text, "DCGM_FI_DEV_FB_USED")] == ["30000", "0"]
    assert [re.sub(r'^.*DCGM_FI_DRIVER_VERSION="580.105.08",', "", line)
            for line in series(text, "gpu_device_plugin_pod_gpu_share")] == [
        'container="c1",namespace="ml",pod="a",vgpu="0"} 0.5', 'container="c2",namespace="ml",pod="b",vgpu="1"} 0.5']
    assert series(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == [
        line for line in series(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") if f'UUID="{first.uuid}"' in line]
    assert len(series(text, "DCGM_FI_DEV_FB_RESERVED")) == 1  # the T4 has no v2 memory info
    assert [value(line) for line in series(text, "DCGM_FI_DEV_XID_ERRORS")] == ["43", "0"]
    assert 'err_code="43",err_msg="GPU stopped processing"' in series(text, "DCGM_FI_DEV_XID_ERRORS")[0]


def test_simulated_gpus_have_no_hardware_so_no_dcgm_series(kubelet_root: Path,
                                                           pod_resources: PodResourcesDouble) -> None:
    daemon = Daemon(settings_for(kubelet_root, device_discovery_strategy="simulated", simulated_gpus=2),
                    SimulatedBackend(2).discover(), None, environ={})
    with RunningDaemon(daemon):
        text = scrape(daemon)
    assert "gpu_device_plugin_info" in text and "DCGM_" not in text
    assert pod_resources.calls == 0  # nothing to label, nothing to ask the kubelet


def test_the_metrics_command_prints_the_values_for_a_person(
        capsys: pytest.CaptureFixture[str], kubelet_root: Path, pod_resources: PodResourcesDouble,
        no_plugin_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "nano-1")
    pod_resources.pods = [Pod("infer-0", "vision", [Container("model", {"nvidia.com/gpu": ["tegra-t210-igpu0"]})])]
    argv = ["metrics", "--device-discovery-strategy", "tegra", "--host-root", str(NANO),
            "--kubelet-socket", str(kubelet_root / "device-plugins" / "kubelet.sock")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("GPU 0  Tegra X1 (T210)  tegra-t210-igpu0  driver R32.7.6  node nano-1\n")
    assert re.search(r"^  DCGM_FI_DEV_GPU_UTIL +45\.3 %$", out, re.M)
    assert re.search(r"^  DCGM_FI_DEV_POWER_USAGE +1\.021 W$", out, re.M)
    assert re.search(r"^  DCGM_FI_DEV_FB_USED +1396 MiB$", out, re.M)
    assert "not available on this GPU: DCGM_FI_DEV_MEMORY_TEMP, DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in out
    assert "  held by: vision/infer-0 (model)\n" in out
    assert cli.main([*argv, "--prometheus"]) == 0
    prometheus = capsys.readouterr().out
    assert prometheus.startswith("# HELP DCGM_FI_DEV_SM_CLOCK ")
    assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="tegra-t210-igpu0",device="nvidia0",modelName="Tegra X1 (T210)",' \
           'Hostname="nano-1",DCGM_FI_DRIVER_VERSION="R32.7.6",container="model",namespace="vision",' \
           'pod="infer-0"} 45.3' in prometheus


def test_the_metrics_command_without_a_gpu_says_why_and_fails(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path, no_plugin_env: None) -> None:
    assert cli.main(["metrics", "--device-discovery-strategy", "tegra", "--host-root", str(tmp_path)]) == 1
    assert capsys.readouterr().out.startswith("no GPU: tegra: no Tegra SoC")
