"""Jetson AGX Thor (T264, L4T R39.2 on meta-tegra wrynose) from a fixture tree built from meta-tegra's own
files at the pin: discovery on the OpenRM driver, what `auto` picks, CDI names from the toolkit's specs,
labels and the node check. Health is in test_thor_health.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from fake_nvml import FakeGpu, FakeNvml
from gpu_device_plugin.cdi import spec as cdi
from gpu_device_plugin.cdi import toolkit_spec
from gpu_device_plugin.cdi.names import jetson_toolkit_name
from gpu_device_plugin.cli import main as cli
from gpu_device_plugin.cli.node_labels import gpu_labels
from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.core import policy
from gpu_device_plugin.discovery import select
from gpu_device_plugin.discovery.base import DiscoveryError
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.discovery.tegra import (
    OPENRM,
    TegraBackend,
    driver_version,
    integrated_gpu,
    parse_gpu_information,
)
from gpu_device_plugin.doctor.csv_files import OPENRM_CSV_NODES, evaluate_csv
from gpu_device_plugin.doctor.gpu import evaluate_device_nodes
from gpu_device_plugin.doctor.openrm import evaluate_openrm_driver
from gpu_device_plugin.doctor.report import FAIL, PASS, SKIP, WARN
from gpu_device_plugin.doctor.run import run_checks
from gpu_device_plugin.model import Gpu
from helpers import FEATURES_OFF

FIXTURES = Path(__file__).parent / "fixtures"
THOR = FIXTURES / "jetson-agx-thor-r39"  # jetson-agx-thor-devkit: T5000 (p3834-0008) on the p4071 carrier
ORIN_NANO = FIXTURES / "jetson-orin-nano-r39"
AGX_ORIN_R36 = FIXTURES / "jetson-agx-orin-r36"
CSV_DIR = "etc/nvidia-container-runtime/host-files-for-container.d"
UUID = "GPU-8d1b4c52-6e0a-5f3b-b7d4-2f9e61a0c3d8"
DGPU_UUID = "GPU-3e7a1c90-44b2-4f6d-8c0e-9d5b2a7f1e63"


def discover(root: Path) -> Gpu:
    (gpu,) = TegraBackend(str(root)).discover()
    return gpu


@pytest.fixture
def board(tmp_path: Path) -> Path:
    """A Thor tree a test may change."""
    root = tmp_path / "root"
    shutil.copytree(THOR, root, symlinks=True)
    return root


def add_dgpu(root: Path, minor: int = 1) -> None:
    """A discrete GPU on the Thor's PCIe, as the NVIDIA driver lists it: it takes minor 1, and the SoC
    display moves to the next one (the node layout the toolkit's own Thor+dGPU tests use)."""
    proc = root / "proc/driver/nvidia/gpus/0000:03:00.0"
    proc.mkdir(parents=True)
    (proc / "information").write_text(f"Model: \t\t NVIDIA RTX 6000 Ada Generation\nGPU UUID: \t {DGPU_UUID}\n"
                                      f"Bus Location: \t 0000:03:00.0\nDevice Minor: \t {minor}\n")
    (root / "dev/nvidia2").write_text("")


# -- discovery --------------------------------------------------------------------------------


def test_thor_is_discovered_with_chip_release_memory_capability_power_mode_and_driver() -> None:
    probe = TegraBackend(str(THOR)).probe()
    assert probe.usable
    assert "NVIDIA Jetson AGX Thor Developer Kit" in probe.reason and "T264" in probe.reason
    assert {"soc0 soc_id 38 = T264", "device tree compatible nvidia,tegra264", "/etc/nv_tegra_release R39.2.0",
            "/run/nvidia-gpu-driver-active openrm-l4t"} <= set(probe.evidence)
    gpu = discover(THOR)
    assert (gpu.id, gpu.name, gpu.index, gpu.backend) == ("tegra-t264-igpu0", "Thor (T264)", 0, "tegra")
    assert gpu.memory_mib == 128825804 // 1024
    assert {key: gpu.properties[key] for key in ("chip", "l4t", "compute_capability", "power_mode", "gpu_driver",
                                                  "driver_version", "uuid", "pci_bus_id")} == {
        "chip": "T264", "l4t": "R39.2.0", "compute_capability": "11.0", "power_mode": "120W",
        "gpu_driver": OPENRM, "driver_version": "595.78", "uuid": UUID, "pci_bus_id": "0000:01:00.0"}


def test_thor_nodes_are_the_gpus_its_control_node_the_display_nvmap_and_host1x_fence() -> None:
    gpu = discover(THOR)
    assert gpu.device_nodes == ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia1", "/dev/nvmap",
                                "/dev/host1x-fence")
    assert gpu.optional_nodes == ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
    # every node discovery reports is one meta-tegra's devices.csv hands containers
    devices_csv = (THOR / CSV_DIR / "devices.csv").read_text()
    listed = {line.split(",", 1)[1].strip() for line in devices_csv.splitlines() if line.startswith("dev,")}
    assert set(gpu.device_nodes) | set(gpu.optional_nodes) <= listed


def test_the_t4000_module_is_found_by_its_chip_without_meta_tegras_driver_record(board: Path) -> None:
    # jetson-agx-thor-t4000: the P3834-0000 module on the same carrier; a root without /run (a
    # container given only /proc, /sys, /dev and /etc) is judged by the chip
    (board / "proc/device-tree/compatible").write_bytes(
        b"nvidia,p4071-0000+p3834-0000\0nvidia,p3834-0000\0nvidia,tegra264\0")
    (board / "run/nvidia-gpu-driver-active").unlink()
    gpu = discover(board)
    assert gpu.properties["gpu_driver"] == OPENRM
    assert gpu.device_nodes[:2] == ("/dev/nvidia0", "/dev/nvidiactl")
    assert "T264: its iGPU runs on OpenRM" in TegraBackend(str(board)).probe().evidence


def test_a_dgpu_beside_thor_keeps_its_node_and_the_display_node_moves_to_the_igpu(board: Path) -> None:
    add_dgpu(board)
    nodes = discover(board).device_nodes
    assert "/dev/nvidia1" not in nodes  # the dGPU's: another GPU, another allocation
    assert nodes[:3] == ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia2")
    assert discover(board).properties["uuid"] == UUID


def test_thor_without_its_nvidia_nodes_names_them_and_the_module(board: Path) -> None:
    (board / "dev/nvidia0").unlink()
    (board / "dev/nvidiactl").unlink()
    with pytest.raises(DiscoveryError, match=r"/dev/nvidia0, /dev/nvidiactl do not exist.*lsmod \| grep nvidia"):
        discover(board)


def test_a_driver_that_lists_only_another_gpu_is_named(board: Path) -> None:
    shutil.rmtree(board / "proc/driver/nvidia/gpus/0000:01:00.0")
    add_dgpu(board)
    with pytest.raises(DiscoveryError, match=r"lists only 0000:03:00.0, not the integrated GPU at 0000:01:00.0"):
        discover(board)


def test_without_the_drivers_proc_files_the_gpu_is_minor_0_and_has_no_uuid(board: Path) -> None:
    shutil.rmtree(board / "proc/driver")
    gpu = discover(board)
    assert gpu.device_nodes[:3] == ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia1")
    assert "uuid" not in gpu.properties and "driver_version" not in gpu.properties


def test_an_orin_stays_on_nvgpu_whatever_nvidia_nodes_its_display_driver_made(tmp_path: Path) -> None:
    root = tmp_path / "orin"
    shutil.copytree(ORIN_NANO, root, symlinks=True)
    (root / "run").mkdir()
    (root / "run/nvidia-gpu-driver-active").write_text("nvgpu-l4t\n")
    (root / "dev/nvidia0").write_text("")  # Orin's display runs on nvidia.ko too
    gpu = discover(root)
    assert gpu.device_nodes == discover(ORIN_NANO).device_nodes
    assert "gpu_driver" not in gpu.properties and gpu.optional_nodes == ()


def test_the_drivers_proc_files_are_read_as_the_open_driver_writes_them() -> None:
    info = parse_gpu_information((THOR / "proc/driver/nvidia/gpus/0000:01:00.0/information").read_text())
    assert (info["Model"], info["Bus Location"], info["Device Minor"]) == ("NVIDIA Thor", "0000:01:00.0", "0")
    assert driver_version((THOR / "proc/driver/nvidia/version").read_text()) == "595.78"
    assert driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.105.08  Release Build\n") == \
        "580.105.08"
    assert integrated_gpu([{"Bus Location": "0000:03:00.0", "Model": "NVIDIA L4"}]) is None
    assert integrated_gpu([{"Bus Location": "0000:05:00.0", "Model": "NVIDIA Thor"}]) is not None


# -- what auto picks ----------------------------------------------------------------------------


def auto(root: Path, monkeypatch: pytest.MonkeyPatch, *gpus: FakeGpu) -> select.Choice:
    fake = FakeNvml(list(gpus), driver_version="595.78", cuda_driver_version=13020)
    monkeypatch.setattr(select, "_nvml", lambda settings: NvmlBackend(settings.host_root, fake))
    return select.choose(Settings(host_root=str(root), device_discovery_strategy="auto"))


def test_auto_serves_thor_with_tegra_although_nvml_answers_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    thor = FakeGpu(UUID, name="NVIDIA Thor", pci_bus_id="00000000:01:00.0", compute_capability=(11, 0))
    choice = auto(THOR, monkeypatch, thor)
    assert choice.backend is not None and choice.backend.name == "tegra"
    assert "\n" not in choice.reason
    assert choice.reason.startswith("auto chose tegra: NVIDIA Jetson AGX Thor Developer Kit (T264, its iGPU on "
                                    "NVIDIA's OpenRM driver)")
    assert "NVML sees only the integrated GPU NVIDIA Thor" in choice.reason
    assert "CSV mode for integrated GPUs" in choice.reason


def test_auto_takes_nvml_when_a_discrete_gpu_sits_beside_thor(monkeypatch: pytest.MonkeyPatch) -> None:
    thor = FakeGpu(UUID, name="NVIDIA Thor", pci_bus_id="00000000:01:00.0")
    dgpu = FakeGpu(DGPU_UUID, name="NVIDIA RTX 6000 Ada Generation", minor=1, pci_bus_id="00000000:03:00.0")
    choice = auto(THOR, monkeypatch, thor, dgpu)
    assert choice.backend is not None and choice.backend.name == "nvml"
    assert "1 discrete GPU(s)" in choice.reason


# -- CDI names from the toolkit's spec -----------------------------------------------------------


@pytest.mark.parametrize(("names", "strategy", "uuid", "expected"), [
    ({"0", "all"}, "index", "", "0"),  # CSV mode, one GPU: Nano, Orin and Thor alike
    ({"0", "all"}, "uuid", UUID, "0"),  # CSV mode has no UUIDs to go by
    ({"all"}, "index", "", "all"),  # "all" is the iGPU when it is the only device
    ({"0", UUID, "all"}, "uuid", UUID, UUID),  # NVML mode names both
    ({"0", UUID, "all"}, "index", UUID, "0"),
    ({"0", "1", UUID, DGPU_UUID, "all"}, "index", UUID, "0"),  # CSV mode with a dGPU beside
    ({"1", DGPU_UUID, "all"}, "index", UUID, ""),  # "all" would hand over the dGPU too
])
def test_the_igpus_name_in_the_toolkits_spec(names: set[str], strategy: str, uuid: str, expected: str) -> None:
    assert jetson_toolkit_name(names, 0, uuid, strategy) == expected


def spec(devices: dict[str, list[str]], hook_args: list[str]) -> str:
    """A toolkit spec in the shape `nvidia-ctk cdi generate` writes (JSON is YAML too)."""
    return json.dumps({
        "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": name, "containerEdits": {"deviceNodes": [{"path": p} for p in nodes]}}
                    for name, nodes in devices.items()],
        "containerEdits": {
            "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "args": hook_args}],
            "mounts": [{"hostPath": "/usr/lib/libcuda.so.1.1", "containerPath": "/usr/lib/libcuda.so.1.1",
                        "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}]},
    })


THOR_NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvmap"]
# `nvidia-ctk cdi generate` on a Thor (auto resolves to CSV mode; one NVML GPU: the pure CSV generator)
CSV_SPEC = spec({"0": THOR_NODES, "all": THOR_NODES},
                ["nvidia-cdi-hook", "enable-cuda-compat", "--host-cuda-version=13.2"])
# ... with --mode=nvml: index, UUID and all, and the driver version in the compat hook
NVML_SPEC = spec({"0": ["/dev/nvidia0"], UUID: ["/dev/nvidia0"], "all": ["/dev/nvidia0"]},
                 ["nvidia-cdi-hook", "enable-cuda-compat", "--host-driver-version=595.78"])


def allocate(root: Path, gpu: Gpu, id_strategy: str = "index") -> list[str]:
    settings = Settings(device_list_strategy=("cdi-cri",), host_root=str(root), device_id_strategy=id_strategy)
    devices = {d.id: d for d in policy.advertised_devices([gpu], settings)}
    namer = toolkit_spec.ToolkitSpecs(str(root)).namer(settings.device_id_strategy)
    return policy.allocate([gpu.id], devices, settings, toolkit_name=namer).cdi_devices


def put_spec(root: Path, text: str) -> None:
    (root / "var/run/cdi").mkdir(parents=True, exist_ok=True)
    (root / "var/run/cdi/nvidia.yaml").write_text(text)


def test_thor_goes_by_the_toolkits_csv_mode_name(board: Path) -> None:
    gpu = discover(board)
    assert allocate(board, gpu) == ["meta-gpu-k8s.io/gpu=0"]  # meta-tegra generates no spec at boot
    put_spec(board, CSV_SPEC)
    assert allocate(board, gpu) == ["nvidia.com/gpu=0"]
    assert allocate(board, gpu, "uuid") == ["nvidia.com/gpu=0"]


def test_an_nvml_mode_spec_names_thor_by_uuid_and_a_stale_one_is_refused(board: Path) -> None:
    gpu = discover(board)
    put_spec(board, NVML_SPEC)
    assert allocate(board, gpu, "uuid") == [f"nvidia.com/gpu={UUID}"]
    put_spec(board, NVML_SPEC.replace("595.78", "580.65.06"))
    found = toolkit_spec.coverage([gpu], toolkit_spec.read_specs(str(board)), "uuid")
    assert found.names == {} and "made for driver 580.65.06, the loaded driver is 595.78" in found.problems[gpu.id]
    assert allocate(board, gpu, "uuid") == ["meta-gpu-k8s.io/gpu=0"]


def test_thors_own_spec_carries_its_nodes_and_the_openrm_libraries(board: Path, tmp_path: Path) -> None:
    settings = Settings(device_list_strategy=("cdi-cri",), host_root=str(board), cdi_spec_dir=str(tmp_path / "cdi"))
    path = cdi.sync_spec([discover(board)], settings)
    assert path is not None
    written = json.loads(Path(path).read_text())
    own = [n["path"] for n in written["devices"][0]["containerEdits"]["deviceNodes"]]
    assert own == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia1", "/dev/nvmap", "/dev/host1x-fence"]
    shared = [n["path"] for n in written["containerEdits"]["deviceNodes"]]
    assert shared == ["/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvsciipc"]
    mounts = {m["containerPath"] for m in written["containerEdits"]["mounts"]}
    assert {"/usr/lib/libcuda.so.1.1", "/usr/lib/libnvidia-rmapi-tegra.so.595.78", "/usr/lib/libnvidia-ml.so.1",
            "/usr/sbin/nvidia-smi"} <= mounts


def test_allocate_passes_the_uvm_nodes_only_once_they_exist(board: Path) -> None:
    gpu = discover(board)
    settings = Settings(device_list_strategy=("envvar",), pass_device_specs=True, host_root=str(board))
    devices = {d.id: d for d in policy.advertised_devices([gpu], settings)}
    present = {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia1", "/dev/nvmap", "/dev/host1x-fence"}
    before = policy.allocate([gpu.id], devices, settings, node_exists=present.__contains__)
    assert [spec[0] for spec in before.device_specs] == list(gpu.device_nodes)
    after = policy.allocate([gpu.id], devices, settings, node_exists=(present | {"/dev/nvidia-uvm"}).__contains__)
    assert [spec[0] for spec in after.device_specs] == [*gpu.device_nodes, "/dev/nvidia-uvm"]
    assert after.envs == {**FEATURES_OFF, "NVIDIA_VISIBLE_DEVICES": "0"}  # CSV mode: the iGPU goes by index


# -- labels ---------------------------------------------------------------------------------------


def test_thor_is_labelled_with_family_chip_l4t_capability_power_mode_and_driver() -> None:
    assert gpu_labels([discover(THOR)], "tegra") == {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "Thor-T264",
        "nvidia.com/gpu.discovery": "tegra", "nvidia.com/gpu.compute.major": "11",
        "nvidia.com/gpu.compute.minor": "0", "nvidia.com/gpu.family": "blackwell", "nvidia.com/gpu.memory": "125806",
        "nvidia.com/cuda.driver-version.full": "595.78", "nvidia.com/cuda.driver-version.major": "595",
        "nvidia.com/cuda.driver-version.minor": "78", "nvidia.com/cuda.driver.major": "595",
        "nvidia.com/cuda.driver.minor": "78", "nvidia.com/gpu.chip": "T264", "nvidia.com/gpu.l4t": "R39.2.0",
        "nvidia.com/gpu.power-mode": "120W"}


def test_thors_power_mode_label_follows_nvpmodel(board: Path) -> None:
    (board / "var/lib/nvpmodel").mkdir(parents=True)
    (board / "var/lib/nvpmodel/status").write_text("pmode:0000 fmode:default\n")
    assert gpu_labels([discover(board)], "tegra")["nvidia.com/gpu.power-mode"] == "MAXN"


@pytest.mark.usefixtures("no_plugin_env")
def test_the_boot_unit_writes_thors_labels_for_k3s(tmp_path: Path) -> None:
    out = tmp_path / "config.yaml.d" / "50-gpu-labels.yaml"
    assert cli.main(["node-labels", "--device-discovery-strategy", "tegra", "--host-root", str(THOR),
                     "--output", str(out)]) == 0
    written = dict(item.split("=", 1) for item in yaml.safe_load(out.read_text())["node-label+"])
    assert written == gpu_labels([discover(THOR)], "tegra")


def test_thor_carries_every_label_key_an_orin_does() -> None:
    assert set(gpu_labels([discover(ORIN_NANO)], "tegra")) <= set(gpu_labels([discover(THOR)], "tegra"))


# -- gpu-device-plugin check ----------------------------------------------------------------------


def thor_checks(root: Path, **overrides: object) -> dict[str, tuple[str, str]]:
    settings = Settings(host_root=str(root), device_discovery_strategy="tegra",
                        kubelet_socket=str(root / "kubelet.sock"), **overrides)  # type: ignore[arg-type]
    return {c.name: (c.status, c.detail + " | " + c.fix) for c in run_checks(settings)}


def test_check_on_thor_passes_its_driver_nodes_csv_and_toolkit() -> None:
    got = thor_checks(THOR)
    assert got["discovery"][0] == PASS and "Thor (T264)" in got["discovery"][1]
    assert got["device nodes"][0] == PASS and "/dev/nvidiactl" in got["device nodes"][1]
    assert got["runtime CSV files"][0] == PASS
    assert got["NVIDIA driver"] == (PASS, "kernel module, libnvidia-rmapi-tegra and /lib/firmware/nvidia/595.78 "
                                          "are all 595.78 (OpenRM) | ")
    assert got["NVIDIA container toolkit"] == (PASS, "/etc/nvidia-container-runtime/config.toml: mode auto | ")
    assert got["NVIDIA CDI spec"][0] == SKIP


def test_check_on_thor_with_the_toolkits_spec_names_it(board: Path) -> None:
    put_spec(board, CSV_SPEC)
    status, detail = thor_checks(board, device_list_strategy=("cdi-cri",))["NVIDIA CDI spec"]
    assert status == PASS and "nvidia.com/gpu=0" in detail


def test_check_on_thor_with_an_orin_era_devices_csv_fails_naming_the_missing_nodes(board: Path) -> None:
    shutil.copy(AGX_ORIN_R36 / CSV_DIR / "devices.csv", board / CSV_DIR / "devices.csv")
    status, detail = thor_checks(board)["runtime CSV files"]
    # scarthgap's list names Orin's display nodes (/dev/nvidia0, /dev/nvidiactl) but not nvidia-uvm
    assert status == FAIL
    assert "list no /dev/nvidia-uvm:" in detail


def test_check_on_thor_with_a_module_and_libraries_of_two_releases_fails(board: Path) -> None:
    library = board / "usr/lib/libnvidia-rmapi-tegra.so.595.78"
    library.rename(library.with_name("libnvidia-rmapi-tegra.so.580.00"))
    status, detail = thor_checks(board)["NVIDIA driver"]
    assert status == FAIL and "kernel module 595.78 but libnvidia-rmapi-tegra 580.00" in detail


def test_check_on_thor_without_its_driver_fails_discovery_with_the_module_named(board: Path) -> None:
    (board / "dev/nvidia0").unlink()
    status, detail = thor_checks(board)["discovery"]
    assert status == FAIL and "lsmod | grep nvidia" in detail


def test_openrm_driver_rules() -> None:
    version = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  595.78  Release Build\n"
    assert evaluate_openrm_driver(None, ["595.78"], True, True).status == FAIL
    assert evaluate_openrm_driver("garbled\n", ["595.78"], True, True).status == WARN
    assert evaluate_openrm_driver(version, [], True, True).status == FAIL
    assert evaluate_openrm_driver(version, ["595.58"], True, True).status == FAIL
    no_firmware = evaluate_openrm_driver(version, ["595.78"], False, True)
    assert no_firmware.status == WARN and "/lib/firmware/nvidia/595.78" in no_firmware.detail
    no_uvm = evaluate_openrm_driver(version, ["595.78"], True, False)
    assert no_uvm.status == WARN and "/dev/nvidia-uvm does not exist" in no_uvm.detail
    assert evaluate_openrm_driver(version, ["595.78"], True, True).status == PASS


def test_csv_and_node_rules_name_thors_nodes_and_driver() -> None:
    orin_csv = ("devices.csv", "dev, /dev/nvgpu/igpu0/ctrl\ndev, /dev/nvmap\n")
    assert evaluate_csv("tegra", [orin_csv]).status == PASS  # an Orin needs no /dev/nvidia* node
    check = evaluate_csv("tegra", [orin_csv], ("/dev/nvidia0", *OPENRM_CSV_NODES))
    assert check.status == FAIL and "tegra-configs-container-csv" in check.fix
    assert "list no /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm:" in check.detail
    bad = evaluate_device_nodes("tegra", ["/dev/nvidia0"], ["device node /dev/nvidia0 is missing"], OPENRM)
    assert bad.status == FAIL and "lsmod | grep nvidia" in bad.fix and "nvgpu" not in bad.fix
