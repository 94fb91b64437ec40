"""NVML GPUs reach containers through the NVIDIA Container Toolkit's CDI spec, read from the host's
/var/run/cdi or /etc/cdi; when it is absent or stale the plugin says why and falls back to envvar."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml
from gpu_device_plugin.cdi import spec as cdi
from gpu_device_plugin.cdi import toolkit_spec
from gpu_device_plugin.config import loader
from gpu_device_plugin.config.settings import ConfigError, Settings
from gpu_device_plugin.core import policy
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.model import Gpu
from gpu_device_plugin.session.daemon import Daemon
from helpers import FEATURES_OFF, RunningDaemon, simulated_settings
from kubelet_double import KubeletDouble

FIXTURE = Path(__file__).parent / "fixtures" / "x86-nvidia-580"
SPEC = FIXTURE / "var/run/cdi/nvidia.yaml"
UUID0 = "GPU-6a3c9e2f-0d4b-4c1e-9a57-1b2c3d4e5f60"
UUID1 = "GPU-7b4d0f30-1e5c-4d2f-8b68-2c3d4e5f6071"


def nvml(driver: str = "580.105.08", minors: tuple[int, int] = (0, 1)) -> FakeNvml:
    return FakeNvml([FakeGpu(UUID0, name="NVIDIA L4", minor=minors[0]),
                     FakeGpu(UUID1, name="NVIDIA L4", minor=minors[1], pci_bus_id="00000000:5E:00.0")],
                    driver_version=driver, cuda_driver_version=13000)


def discover(root: Path, fake: FakeNvml | None = None) -> list[Gpu]:
    return NvmlBackend(str(root), fake or nvml()).discover()


def host_with_spec(tmp_path: Path, spec_dir: str = "var/run/cdi") -> Path:
    (tmp_path / spec_dir).mkdir(parents=True)
    shutil.copy(SPEC, tmp_path / spec_dir / "nvidia.yaml")
    return tmp_path


def allocate(gpus: list[Gpu], root: Path, ids: list[str], **overrides: object) -> policy.ContainerAllocation:
    settings = Settings(device_list_strategy=("cdi-cri",), host_root=str(root))._replace(**overrides)  # type: ignore[arg-type]
    devices = {d.id: d for d in policy.advertised_devices(gpus, settings)}
    namer = toolkit_spec.ToolkitSpecs(str(root)).namer(settings.device_id_strategy)
    return policy.allocate(ids, devices, settings, toolkit_name=namer)


def test_the_toolkit_spec_fixture_reads_as_nvidia_ctk_writes_it() -> None:
    spec = toolkit_spec.parse_spec(SPEC.read_text(), str(SPEC))
    assert spec.kind == "nvidia.com/gpu"
    assert set(spec.devices) == {"0", "1", UUID0, UUID1, "all"}
    assert spec.devices[UUID1] == ("/dev/nvidia1",)
    assert spec.driver_version == "580.105.08"  # from the enable-cuda-compat hook
    assert spec.libraries == 3


@pytest.mark.parametrize(("id_strategy", "gpu", "expected"), [
    ("uuid", UUID1, f"nvidia.com/gpu={UUID1}"),
    ("index", UUID1, "nvidia.com/gpu=1"),
])
def test_allocate_names_the_toolkit_device_for_each_id_strategy(id_strategy: str, gpu: str, expected: str) -> None:
    gpus = discover(FIXTURE)
    result = allocate(gpus, FIXTURE, [gpu], device_id_strategy=id_strategy)
    assert result.cdi_devices == [expected]
    assert result.envs == FEATURES_OFF  # CDI alone: the toolkit's spec carries the driver libraries


def test_annotations_carry_the_same_toolkit_names() -> None:
    result = allocate(discover(FIXTURE), FIXTURE, [UUID0, UUID1], device_list_strategy=("cdi-annotations",))
    assert list(result.annotations.values()) == [f"nvidia.com/gpu={UUID0},nvidia.com/gpu={UUID1}"]


def test_a_spec_in_etc_cdi_is_found_too(tmp_path: Path) -> None:
    root = host_with_spec(tmp_path, "etc/cdi")
    assert allocate(discover(root), root, [UUID0]).cdi_devices == [f"nvidia.com/gpu={UUID0}"]


def test_no_spec_falls_back_to_envvar_and_says_why_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gpus = discover(tmp_path)
    settings = Settings(device_list_strategy=("cdi-cri",), host_root=str(tmp_path))
    devices = {d.id: d for d in policy.advertised_devices(gpus, settings)}
    toolkit = toolkit_spec.ToolkitSpecs(str(tmp_path))
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            result = policy.allocate([UUID0], devices, settings, toolkit_name=toolkit.namer("uuid"))
    assert result.cdi_devices == [] and result.envs == {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": UUID0}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "no spec of the NVIDIA Container Toolkit" in errors[0] and "nvidia-ctk cdi generate" in errors[0]


def test_a_spec_made_for_another_driver_is_stale(tmp_path: Path) -> None:
    gpus = discover(FIXTURE, nvml(driver="580.119.02"))
    name, problem = toolkit_spec.match_gpu(gpus[0], toolkit_spec.read_specs(str(FIXTURE)), "uuid")
    assert name == ""
    assert "made for driver 580.105.08, the loaded driver is 580.119.02" in problem
    assert allocate(gpus, FIXTURE, [UUID0]).envs == {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": UUID0}


def test_a_spec_whose_device_nodes_moved_is_stale() -> None:
    gpus = discover(FIXTURE, nvml(minors=(1, 0)))  # the GPUs swapped places since the spec was made
    _, problem = toolkit_spec.match_gpu(gpus[0], toolkit_spec.read_specs(str(FIXTURE)), "uuid")
    assert "gives GPU-6a3c" in problem and "NVML says this GPU is /dev/nvidia1" in problem


def test_a_gpu_the_spec_does_not_name_falls_back(tmp_path: Path) -> None:
    root = host_with_spec(tmp_path)
    text = (root / "var/run/cdi/nvidia.yaml").read_text().replace(UUID1, "GPU-00000000-dead-beef-0000-000000000000")
    (root / "var/run/cdi/nvidia.yaml").write_text(text.replace('name: "1"', 'name: "7"'))
    gpus = discover(root)
    coverage = toolkit_spec.coverage(gpus, toolkit_spec.read_specs(str(root)), "uuid")
    assert coverage.names == {UUID0: f"nvidia.com/gpu={UUID0}"}
    assert "names neither " + UUID1 in coverage.problems[UUID1]
    # a container asking for both GPUs goes envvar whole: half CDI, half envvar would lose one
    assert allocate(gpus, root, [UUID0, UUID1]).envs == {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": f"{UUID0},{UUID1}"}


def test_a_spec_written_after_start_is_used_from_the_next_allocate(tmp_path: Path) -> None:
    gpus = discover(tmp_path)
    toolkit = toolkit_spec.ToolkitSpecs(str(tmp_path))
    assert toolkit.namer("uuid")(gpus[0]) is None
    host_with_spec(tmp_path)  # the boot unit ran nvidia-ctk cdi generate after the driver loaded
    assert toolkit.namer("uuid")(gpus[0]) == f"nvidia.com/gpu={UUID0}"


def test_broken_and_foreign_spec_files_are_skipped_with_a_warning(tmp_path: Path) -> None:
    root = host_with_spec(tmp_path)
    (root / "var/run/cdi/broken.yaml").write_text("kind: nvidia.com/gpu\ndevices: [\n")
    (root / "var/run/cdi/other.json").write_text('{"cdiVersion": "0.5.0", "kind": "example.com/fpga", "devices": []}')
    warnings: list[str] = []
    specs = toolkit_spec.read_specs(str(root), warn=warnings.append)
    assert [os.path.basename(s.path) for s in specs] == ["nvidia.yaml"]
    assert len(warnings) == 1 and "broken.yaml is not valid YAML/JSON" in warnings[0]


def test_the_plugin_writes_no_spec_of_its_own_for_nvml_gpus(tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    settings = Settings(device_list_strategy=("cdi-cri",), cdi_spec_dir=str(spec_dir), host_root=str(FIXTURE))
    spec_dir.mkdir()
    leftover = Path(cdi.spec_path(str(spec_dir), settings.cdi_kind))
    leftover.write_text("{}")  # from an older plugin that wrote bare nodes for NVML GPUs
    assert cdi.sync_spec(discover(FIXTURE), settings) is None
    assert not leftover.exists()


def test_nvml_with_cdi_is_accepted_and_our_kind_may_not_be_the_toolkits() -> None:
    settings = loader.build({"device_discovery_strategy": "nvml", "device_list_strategy": ("cdi-cri",)}, {}, None)
    assert settings.device_list_strategy == ("cdi-cri",)
    with pytest.raises(ConfigError, match=r"^--cdi-kind nvidia.com/gpu is the NVIDIA Container Toolkit's own kind"):
        loader.build({"device_discovery_strategy": "tegra", "device_list_strategy": ("cdi-cri",),
                      "cdi_kind": "nvidia.com/gpu"}, {}, None)


def test_the_daemon_hands_the_kubelet_toolkit_names(socket_dir: str, kubelet: KubeletDouble,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    settings = simulated_settings(socket_dir)._replace(device_discovery_strategy="nvml", simulated_gpus=0,
                       device_list_strategy=("cdi-cri",), host_root=str(FIXTURE), cdi_spec_dir=socket_dir)
    with caplog.at_level(logging.INFO), RunningDaemon(Daemon(settings, discover(FIXTURE), None, environ={})):
        response = kubelet.wait_registered().allocate([UUID1])
    [container] = response.container_responses
    assert [d.name for d in container.cdi_devices] == [f"nvidia.com/gpu={UUID1}"]
    assert dict(container.envs) == FEATURES_OFF
    assert any(f"goes to containers as nvidia.com/gpu={UUID0}" in r.getMessage() for r in caplog.records)


def test_a_spec_rewritten_in_place_is_read_again(tmp_path: Path) -> None:
    root = host_with_spec(tmp_path)
    gpus = discover(root)
    toolkit = toolkit_spec.ToolkitSpecs(str(root))
    assert toolkit.namer("uuid")(gpus[1]) == f"nvidia.com/gpu={UUID1}"
    spec = root / "var/run/cdi/nvidia.yaml"
    # same file, same directory entry: GPU 1 is no longer in it, by UUID or by index
    spec.write_text(spec.read_text().replace(UUID1, "GPU-gone").replace('name: "1"', 'name: "5"'))
    os.utime(spec, ns=(spec.stat().st_mtime_ns + 10**9,) * 2)
    assert toolkit.namer("uuid")(gpus[1]) is None
