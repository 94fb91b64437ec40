"""Jetson Orin (T234) on L4T R36 (meta-tegra scarthgap) and R39 (wrynose), from fixture trees built from
meta-tegra's own files at those pins: discovery, CDI names, labels, health and the node check. The
Nano's fixture runs through the same paths, so both stay first-class."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_device_plugin.cdi import spec as cdi
from gpu_device_plugin.cdi import toolkit_spec
from gpu_device_plugin.cli.node_labels import gpu_labels
from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.core import policy
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.doctor.nvidia_stack import evaluate_jetson_toolkit
from gpu_device_plugin.doctor.report import FAIL, PASS, SKIP, WARN
from gpu_device_plugin.doctor.run import run_checks
from gpu_device_plugin.health.tegra import TegraHealthMonitor, classify_kmsg_line
from gpu_device_plugin.model import Gpu
from helpers import Reports

FIXTURES = Path(__file__).parent / "fixtures"
ORIN_NANO = FIXTURES / "jetson-orin-nano-r39"  # wrynose: R39.2, toolkit 1.19 in CSV mode, no CDI spec
AGX_ORIN = FIXTURES / "jetson-agx-orin-r36"  # scarthgap: R36.5, a CSV-mode CDI spec from nvidia-ctk
NANO = FIXTURES / "jetson-nano"
PASSTHROUGH = "/usr/share/nvidia-container-passthrough"


def discover(root: Path) -> Gpu:
    (gpu,) = TegraBackend(str(root)).discover()
    return gpu


@pytest.mark.parametrize(("root", "l4t", "power", "memory", "evidence"), [
    (ORIN_NANO, "R39.2.0", "MAXN_SUPER", 7441, "soc0 soc_id 35 = T234"),
    (AGX_ORIN, "R36.5.0", "MODE_30W", 62827, "tegra_fuse chip id 35 = T234"),
])
def test_orin_is_discovered_with_chip_release_memory_capability_and_power_mode(
        root: Path, l4t: str, power: str, memory: int, evidence: str) -> None:
    probe = TegraBackend(str(root)).probe()
    assert probe.usable and evidence in probe.evidence
    assert "device tree compatible nvidia,tegra234" in probe.evidence
    gpu = discover(root)
    assert (gpu.id, gpu.name, gpu.index) == ("tegra-t234-igpu0", "Orin (T234)", 0)
    assert gpu.properties["l4t"] == l4t
    assert gpu.properties["compute_capability"] == "8.7"
    assert gpu.properties["power_mode"] == power
    assert gpu.memory_mib == memory


def test_orin_device_nodes_are_the_nvgpu_tree_nvmap_and_host1x_fence() -> None:
    nodes = discover(ORIN_NANO).device_nodes
    assert "/dev/host1x-fence" in nodes and "/dev/nvmap" in nodes
    assert {f"/dev/nvgpu/igpu0/{n}" for n in ("as", "channel", "ctrl", "tsg", "prof-dev")} <= set(nodes)
    # every GPU node discovery reports is one meta-tegra's devices.csv hands containers
    devices_csv = (ORIN_NANO / "etc/nvidia-container-runtime/host-files-for-container.d/devices.csv").read_text()
    listed = {line.split(",", 1)[1].strip() for line in devices_csv.splitlines() if line.startswith("dev,")}
    assert set(nodes) <= listed


def test_orin_without_its_gpu_driver_names_the_missing_nodes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(ORIN_NANO, root, symlinks=True)
    shutil.rmtree(root / "dev/nvgpu")
    with pytest.raises(Exception, match=r"no GPU device node .*/dev/nvgpu/igpu0/ctrl"):
        discover(root)


@pytest.mark.parametrize(("text", "release"), [
    ("# R32 (release), REVISION: 7.6, GCID: 38171779, BOARD: t210ref, EABI: aarch64, DATE: Tue Nov  5 2024",
     "R32.7.6"),
    ("# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64, DATE: Fri Sep 13 2024",
     "R36.4.0"),
    ("# R36 (release), REVISION: 4.4, GCID: 41062509, BOARD: generic, EABI: aarch64, DATE: Mon Jun 16 2025",
     "R36.4.4"),
    ("# R39 (release), REVISION: 2.0, GCID: 43012744, BOARD: generic, EABI: aarch64, DATE: Wed Jul 29 2026",
     "R39.2.0"),
    ("# R39 (release), REVISION: 2.0\n", "R39.2.0"),
    ("R36 4.0 without the usual shape", ""),
])
def test_nv_tegra_release_formats(tmp_path: Path, text: str, release: str) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nv_tegra_release").write_text(text + "\n")
    assert TegraBackend(str(tmp_path)).l4t_release() == release


def test_the_release_copy_in_usr_share_is_read_when_etc_has_none(tmp_path: Path) -> None:
    (tmp_path / "usr/share/nv_tegra").mkdir(parents=True)
    (tmp_path / "usr/share/nv_tegra/nv_tegra_release").write_text("# R39 (release), REVISION: 2.0, GCID: 1\n")
    assert TegraBackend(str(tmp_path)).l4t_release() == "R39.2.0"


def test_power_mode_follows_the_status_file_and_names_unknown_modes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(ORIN_NANO, root, symlinks=True)
    backend = TegraBackend(str(root))
    assert backend.power_mode() == "MAXN_SUPER"  # no status yet: the configuration's default
    (root / "var/lib/nvpmodel").mkdir(parents=True)
    (root / "var/lib/nvpmodel/status").write_text("pmode:0000 fmode:quiet\n")
    assert backend.power_mode() == "15W"
    (root / "var/lib/nvpmodel/status").write_text("pmode:0009\n")
    assert backend.power_mode() == "mode 9"
    assert TegraBackend(str(NANO)).power_mode() == ""  # no nvpmodel: no label


# -- CDI -------------------------------------------------------------------------------------


def allocate(root: Path, gpu: Gpu) -> list[str]:
    settings = Settings(device_list_strategy=("cdi-cri",), host_root=str(root))
    devices = {d.id: d for d in policy.advertised_devices([gpu], settings)}
    namer = toolkit_spec.ToolkitSpecs(str(root)).namer(settings.device_id_strategy)
    return policy.allocate([gpu.id], devices, settings, toolkit_name=namer).cdi_devices


def test_orin_with_the_toolkits_csv_mode_spec_gets_its_name() -> None:
    assert allocate(AGX_ORIN, discover(AGX_ORIN)) == ["nvidia.com/gpu=0"]


def test_orin_without_a_toolkit_spec_and_the_nano_get_the_plugins_own_spec() -> None:
    assert allocate(ORIN_NANO, discover(ORIN_NANO)) == ["meta-gpu-k8s.io/gpu=0"]
    assert allocate(NANO, discover(NANO)) == ["meta-gpu-k8s.io/gpu=0"]


def test_own_spec_on_orin_takes_csv_libraries_from_meta_tegras_passthrough_tree(tmp_path: Path) -> None:
    settings = Settings(device_list_strategy=("cdi-cri",), host_root=str(ORIN_NANO), cdi_spec_dir=str(tmp_path))
    assert cdi.read_alt_roots(str(ORIN_NANO)) == [PASSTHROUGH]
    path = cdi.sync_spec([discover(ORIN_NANO)], settings)
    assert path is not None
    spec = json.loads(Path(path).read_text())
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    # the passthrough copy wins, as in the runtime's CSV mode; the rest come from the rootfs
    assert mounts["/usr/lib/aarch64-linux-gnu/libv4l2.so.0"] == PASSTHROUGH + "/usr/lib/aarch64-linux-gnu/libv4l2.so.0"
    assert mounts["/usr/lib/libcuda.so.1.1"] == "/usr/lib/libcuda.so.1.1"
    assert mounts["/usr/lib/libcuda.so"] == "/usr/lib/libcuda.so"
    device_nodes = [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]
    assert "/dev/host1x-fence" in device_nodes and "/dev/nvgpu/igpu0/ctrl" in device_nodes
    shared_nodes = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert shared_nodes == ["/dev/nvsciipc"]  # listed in devices.csv, present, not a GPU node


# -- labels ----------------------------------------------------------------------------------


def test_nano_and_orin_carry_the_same_label_keys() -> None:
    orin = gpu_labels([discover(ORIN_NANO)], "tegra")
    nano = gpu_labels([discover(NANO)], "tegra")
    assert set(orin) - {"nvidia.com/gpu.power-mode"} == set(nano)
    assert orin["nvidia.com/gpu.chip"] == "T234" and nano["nvidia.com/gpu.chip"] == "T210"
    assert (orin["nvidia.com/gpu.compute.major"], orin["nvidia.com/gpu.compute.minor"]) == ("8", "7")
    assert orin["nvidia.com/gpu.family"] == "ampere" and orin["nvidia.com/gpu.l4t"] == "R39.2.0"
    assert orin["nvidia.com/gpu.power-mode"] == "MAXN_SUPER"
    assert gpu_labels([discover(AGX_ORIN)], "tegra")["nvidia.com/gpu.power-mode"] == "MODE_30W"


# -- health ----------------------------------------------------------------------------------

ORIN_GPU = "17000000.gpu"


def orin_log(function: str, text: str) -> str:
    return f"3,2051,88123456,-;nvgpu: {ORIN_GPU} {function:>33}:{1134:<4} [ERR]  {text}"


@pytest.mark.parametrize(("line", "xid"), [
    (orin_log("nvgpu_set_err_notifier_locked", "error notifier set to 8 for ch 511"), 8),
    (orin_log("ga10b_fifo_ctxsw_timeout_isr", "ctxsw timeout error: active engine id =0, tsg=2, ms=3100"), 109),
    (orin_log("ga10b_gr_intr_handle_sm_exception", "sm exception: gpc 0 tpc 1 sm 0, hww global esr 0x10"), 13),
    (orin_log("nvgpu_sw_quiesce_thread", "SW quiesce done"), None),
])
def test_orin_driver_log_lines_are_judged_like_the_nanos(line: str, xid: int | None) -> None:
    found = classify_kmsg_line(line)
    assert found is not None and found.xid == xid


@pytest.fixture
def orin_board(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    root = tmp_path / "root"
    shutil.copytree(ORIN_NANO, root, symlinks=True)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    yield root, kmsg


def wait(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_orin_goes_unhealthy_when_host1x_fence_goes_and_recovers(orin_board: tuple[Path, Path]) -> None:
    root, kmsg = orin_board
    monitor = TegraHealthMonitor(str(root), str(kmsg), env={}, recovery_quiet_period_s=0.2,
                                 recheck_interval_s=0.05, file_poll_interval_s=0.02)
    reports = Reports()
    monitor.start([discover(root)], reports)
    try:
        (root / "dev/host1x-fence").unlink()
        wait(lambda: reports.calls)
        assert "/dev/host1x-fence is missing" in reports.calls[0][1].reason
        (root / "dev/host1x-fence").write_text("")
        wait(lambda: len(reports.calls) == 2)
        with open(kmsg, "a") as f:
            f.write(orin_log("nvgpu_sw_quiesce_thread", "SW quiesce done") + "\n")
        wait(lambda: len(reports.calls) == 3)
        assert reports.healthy_flags() == [False, True, False]
    finally:
        monitor.stop()


# -- gpu-device-plugin check -----------------------------------------------------------------


def orin_checks(root: Path, **overrides: object) -> dict[str, tuple[str, str]]:
    settings = Settings(host_root=str(root), device_discovery_strategy="tegra",
                        kubelet_socket=str(root / "kubelet.sock"), **overrides)  # type: ignore[arg-type]
    return {c.name: (c.status, c.detail + " | " + c.fix) for c in run_checks(settings)}


@pytest.mark.parametrize("root", [ORIN_NANO, AGX_ORIN])
def test_check_on_orin_passes_discovery_nodes_and_csv(root: Path) -> None:
    got = orin_checks(root)
    assert got["discovery"][0] == PASS and "Orin (T234)" in got["discovery"][1]
    assert got["device nodes"][0] == PASS
    assert got["runtime CSV files"][0] == PASS
    assert got["NVIDIA driver"][0] == SKIP


def test_check_on_orin_knows_the_toolkit_config_and_its_cdi_spec() -> None:
    nano = orin_checks(ORIN_NANO)
    assert nano["NVIDIA container toolkit"] == (PASS, "/etc/nvidia-container-runtime/config.toml: mode csv | ")
    assert nano["NVIDIA CDI spec"][0] == SKIP  # no toolkit spec, CDI not used: CSV mode serves it
    agx = orin_checks(AGX_ORIN, device_list_strategy=("cdi-cri",))
    assert agx["NVIDIA CDI spec"][0] == PASS and "nvidia.com/gpu=0" in agx["NVIDIA CDI spec"][1]
    # the AGX fixture has no config.toml: nvidia-container-setup.service has not run
    assert agx["NVIDIA container toolkit"][0] == FAIL
    assert "nvidia-container-setup.service" in agx["NVIDIA container toolkit"][1]


def test_toolkit_config_rules() -> None:
    assert evaluate_jetson_toolkit("tegra", "R32.7.6", None, False, [], False).status == SKIP
    assert evaluate_jetson_toolkit("nvml", "", None, False, [], False).status == SKIP
    dangling = evaluate_jetson_toolkit("tegra", "R39.2.0", None, True, [], False)
    assert dangling.status == FAIL and "links to a file that does not exist" in dangling.detail
    cdi_without_spec = evaluate_jetson_toolkit("tegra", "R36.5.0", 'mode = "cdi"\n', False, [], False)
    assert cdi_without_spec.status == FAIL and "every GPU container fails" in cdi_without_spec.detail
    assert evaluate_jetson_toolkit("tegra", "R36.5.0", 'mode = "cdi"\n', False, [], True).status == PASS
    assert evaluate_jetson_toolkit("tegra", "R36.5.0", 'mode = "legacy"\n', False, [], False).status == WARN
    missing_root = evaluate_jetson_toolkit("tegra", "R39.2.0", 'mode = "auto"\n', False, [PASSTHROUGH], False)
    assert missing_root.status == WARN and "tegra-container-passthrough" in missing_root.fix
    # an Orin left in auto depends on NVML's answer: the check asks for csv
    orin_auto = evaluate_jetson_toolkit("tegra", "R39.2.0", 'mode = "auto"\n', False, [], False, chip="T234")
    assert orin_auto.status == WARN and "NVML" in orin_auto.detail and 'mode = "csv"' in orin_auto.fix
    assert evaluate_jetson_toolkit("tegra", "R39.2.0", 'mode = "csv"\n', False, [], False, chip="T234").status == PASS


def test_dangling_config_link_is_found_on_the_node(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(ORIN_NANO, root, symlinks=True)
    config = root / "etc/nvidia-container-runtime/config.toml"
    config.unlink()
    os.symlink("/run/nvidia-container-runtime/config.toml-that-is-not-there", config)
    assert orin_checks(root)["NVIDIA container toolkit"][0] == FAIL


def test_a_jetson_served_by_the_plugins_own_spec_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        toolkit_spec.report([discover(NANO)], Settings(device_list_strategy=("cdi-cri",), host_root=str(NANO)))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == toolkit_spec.__name__]
    assert lines and all(level == logging.INFO for level, _ in lines)
    assert "its containers get the plugin's own spec" in lines[0][1]
