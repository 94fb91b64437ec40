"""`gpu-device-plugin check` on an x86-64 node with discrete GPUs: the driver (loaded, kernel module and
libnvidia-ml of one version) and the NVIDIA Container Toolkit's CDI spec (present, complete, current)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml
from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.discovery import select
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.doctor.nvidia_stack import evaluate_driver, kernel_driver_version
from gpu_device_plugin.doctor.report import FAIL, PASS, SKIP, WARN
from gpu_device_plugin.doctor.run import run_checks

FIXTURE = Path(__file__).parent / "fixtures" / "x86-nvidia-580"
UUIDS = ("GPU-6a3c9e2f-0d4b-4c1e-9a57-1b2c3d4e5f60", "GPU-7b4d0f30-1e5c-4d2f-8b68-2c3d4e5f6071")


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "root"
    shutil.copytree(FIXTURE, root, symlinks=True)
    fake = FakeNvml([FakeGpu(UUIDS[0], name="NVIDIA L4", minor=0), FakeGpu(UUIDS[1], name="NVIDIA L4", minor=1)],
                    driver_version="580.105.08")
    monkeypatch.setattr(select, "_nvml", lambda settings: NvmlBackend(settings.host_root, fake))
    # the module loaded at boot, the spec was generated right after
    os.utime(root / "sys/module/nvidia", (1_000, 1_000))
    os.utime(root / "var/run/cdi/nvidia.yaml", (2_000, 2_000))
    return root


def checks(root: Path, **settings: object) -> dict[str, tuple[str, str]]:
    found = run_checks(Settings(host_root=str(root), device_discovery_strategy="nvml",
                                kubelet_socket=str(root / "kubelet.sock"), **settings))  # type: ignore[arg-type]
    return {c.name: (c.status, c.detail + " | " + c.fix) for c in found}


def test_a_node_as_the_image_sets_it_up_passes_the_driver_and_cdi_checks(node: Path) -> None:
    got = checks(node, device_list_strategy=("cdi-cri",))
    assert got["NVIDIA driver"] == (PASS, "kernel module and libnvidia-ml are both 580.105.08 | ")
    status, detail = got["NVIDIA CDI spec"]
    assert status == PASS
    assert f"nvidia.com/gpu={UUIDS[0]}, nvidia.com/gpu={UUIDS[1]}" in detail
    assert "/var/run/cdi/nvidia.yaml" in detail and "mode is cdi" in detail
    assert got["container runtime"][0] == PASS


def test_driver_not_loaded_fails_naming_modprobe(node: Path) -> None:
    (node / "proc/driver/nvidia/version").unlink()
    status, detail = checks(node)["NVIDIA driver"]
    assert status == FAIL and "not loaded" in detail and "modprobe nvidia" in detail


def test_kernel_module_and_userspace_of_different_versions_fail(node: Path) -> None:
    os.rename(node / "usr/lib/libnvidia-ml.so.580.105.08", node / "usr/lib/libnvidia-ml.so.580.95.05")
    status, detail = checks(node)["NVIDIA driver"]
    assert status == FAIL
    assert "kernel module 580.105.08 but libnvidia-ml 580.95.05" in detail and "version mismatch" in detail


def test_no_toolkit_spec_fails_when_cdi_is_used_and_warns_otherwise(node: Path) -> None:
    (node / "var/run/cdi/nvidia.yaml").unlink()
    status, detail = checks(node, device_list_strategy=("cdi-cri",))["NVIDIA CDI spec"]
    assert status == FAIL and "containers asking for CDI devices fail" in detail
    assert "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml" in detail
    (node / "etc/nvidia-container-runtime/config.toml").write_text('[nvidia-container-runtime]\nmode = "legacy"\n')
    assert checks(node)["NVIDIA CDI spec"][0] == WARN


def test_a_spec_older_than_the_driver_load_warns(node: Path) -> None:
    os.utime(node / "var/run/cdi/nvidia.yaml", (500, 500))
    status, detail = checks(node)["NVIDIA CDI spec"]
    assert status == WARN and "older than the loaded driver" in detail


def test_a_spec_missing_a_gpu_fails_naming_it(node: Path) -> None:
    spec = node / "var/run/cdi/nvidia.yaml"
    spec.write_text(spec.read_text().replace(UUIDS[1], "GPU-other").replace('name: "1"', 'name: "9"'))
    status, detail = checks(node)["NVIDIA CDI spec"]
    assert status == FAIL and "GPU 1: " in detail and UUIDS[1] in detail


def test_driver_rules_without_a_gpu_or_a_readable_version() -> None:
    assert evaluate_driver("tegra", "", [], False).status == SKIP
    assert evaluate_driver("nvml", "", ["580.105.08"], True).status == WARN
    assert evaluate_driver("nvml", "580.105.08", [], True).status == WARN
    assert kernel_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024") \
        == "550.54.15"
    assert kernel_driver_version(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.105.08  Release Build") == "580.105.08"


def running(root: Path, *programs: str) -> None:
    """Processes by their /proc/<pid>/comm (15 characters at most), after any already there."""
    first = 100 + len(list(root.glob("proc/[0-9]*")))
    for pid, comm in enumerate(programs, first):
        (root / f"proc/{pid}").mkdir(parents=True)
        (root / f"proc/{pid}/comm").write_text(comm + "\n")


def test_an_nvswitch_without_fabric_manager_fails_naming_error_802(node: Path) -> None:
    (node / "proc/driver/nvidia-nvswitch/devices/0000:05:00.0").mkdir(parents=True)
    running(node, "nvidia-persiste")
    status, detail = checks(node)["NVIDIA data-centre services"]
    assert status == FAIL and "Fabric Manager is not running" in detail and "(802)" in detail
    running(node, "nv-fabricmanage")
    status, detail = checks(node)["NVIDIA data-centre services"]
    assert status == PASS and "Fabric Manager running for 1 NVSwitch(es)" in detail


def test_a_node_without_persistenced_is_told_and_a_missing_libnvidia_cfg_named(node: Path) -> None:
    status, detail = checks(node)["NVIDIA data-centre services"]
    assert status == WARN and "nvidia-persistenced is not running" in detail and "libnvidia-cfg.so.1" in detail
    (node / "usr/lib/libnvidia-cfg.so.1").write_text("")
    assert "libnvidia-cfg" not in checks(node)["NVIDIA data-centre services"][1]
    running(node, "nvidia-persiste")
    assert checks(node)["NVIDIA data-centre services"] == (PASS, "nvidia-persistenced running; no NVSwitch | ")


def test_isolation_on_the_node_follows_its_runtime_config(node: Path) -> None:
    # the fixture's config sets only mode = "cdi": the toolkit's default accepts the variable from anyone
    status, detail = checks(node, device_list_strategy=("cdi-cri",))["GPU isolation"]
    assert status == WARN and "gets every GPU without requesting one" in detail
    shipped = Path(__file__).resolve().parents[2] / "meta-gpu-k8s/recipes-containers/nvidia-container-toolkit/files"
    (node / "etc/nvidia-container-runtime/config.toml").write_text((shipped / "config.toml").read_text())
    assert checks(node, device_list_strategy=("volume-mounts",))["GPU isolation"][0] == PASS
    status, detail = checks(node, device_list_strategy=("envvar",))["GPU isolation"]
    assert status == FAIL and "the plugin refuses to start" in detail and "leave deviceListStrategy out" in detail
    # the built-in default takes the hand-over this runtime honours
    status, detail = checks(node)["GPU isolation"]
    assert status == PASS and "the plugin chose volume-mounts" in detail
