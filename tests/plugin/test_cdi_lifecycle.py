"""The CDI spec outlives a plugin stop; it goes only when CDI is turned off or moves."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from gpu_device_plugin.cdi import spec
from gpu_device_plugin.cdi.lifecycle import CdiSpecKeeper
from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.session.daemon import Daemon
from helpers import RunningDaemon, simulated_settings, wait_until
from kubelet_double import KubeletDouble

GPUS = SimulatedBackend(2).discover()


def cdi_settings(spec_dir: Path, **overrides: object) -> Settings:
    base = Settings(device_discovery_strategy="simulated", simulated_gpus=2, device_list_strategy=("cdi-cri",),
                    cdi_spec_dir=str(spec_dir))
    return base._replace(**overrides)  # type: ignore[arg-type]


def test_turning_cdi_off_removes_the_spec(tmp_path: Path) -> None:
    keeper = CdiSpecKeeper(GPUS)
    on = cdi_settings(tmp_path)
    keeper.sync(on)
    assert os.listdir(tmp_path) == ["meta-gpu-k8s.io-gpu.json"]
    keeper.switch(on, on._replace(device_list_strategy=("envvar",)))
    assert os.listdir(tmp_path) == []


def test_a_spec_left_by_a_run_with_cdi_on_goes_when_the_next_run_has_it_off(tmp_path: Path) -> None:
    CdiSpecKeeper(GPUS).sync(cdi_settings(tmp_path))
    CdiSpecKeeper(GPUS).sync(cdi_settings(tmp_path, device_list_strategy=("envvar",)))
    assert os.listdir(tmp_path) == []


def test_a_new_kind_or_directory_moves_the_spec(tmp_path: Path) -> None:
    keeper = CdiSpecKeeper(GPUS)
    old = cdi_settings(tmp_path / "a")
    keeper.sync(old)
    new = cdi_settings(tmp_path / "b", cdi_kind="example.com/gpu")
    keeper.switch(old, new)
    assert os.listdir(tmp_path / "a") == []
    assert os.listdir(tmp_path / "b") == ["example.com-gpu.json"]


def test_a_failed_removal_is_logged_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    def refuse(spec_dir: str, kind: str) -> bool:
        raise OSError(13, f"cannot remove CDI spec {spec_dir}: Permission denied; delete it by hand")

    keeper = CdiSpecKeeper(GPUS)
    old = cdi_settings(tmp_path / "a")
    keeper.sync(old)
    monkeypatch.setattr(spec, "remove_spec", refuse)
    with caplog.at_level(logging.ERROR):
        keeper.switch(old, cdi_settings(tmp_path / "b"))
        keeper.switch(cdi_settings(tmp_path / "b"), cdi_settings(tmp_path / "b", device_list_strategy=("envvar",)))
    assert sum("Permission denied" in r.getMessage() for r in caplog.records) == 2
    assert os.listdir(tmp_path / "b") == ["meta-gpu-k8s.io-gpu.json"]


def test_a_reload_whose_spec_removal_fails_keeps_the_daemon_serving_and_stop_exits_zero(
        socket_dir: str, kubelet: KubeletDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    spec_dir = Path(socket_dir) / "cdi"
    first = simulated_settings(socket_dir, device_list_strategy=("cdi-cri",), cdi_spec_dir=str(spec_dir))
    second = first._replace(cdi_kind="example.com/gpu")
    settings = iter([second])
    daemon = Daemon(first, GPUS, None, reload_settings=lambda: next(settings), environ={})

    def refuse(spec_dir: str, kind: str) -> bool:
        raise OSError(30, "cannot remove CDI spec: Read-only file system")

    runner = RunningDaemon(daemon)
    with runner:
        endpoint = kubelet.wait_registered()
        monkeypatch.setattr(spec, "remove_spec", refuse)
        daemon.request_reload()
        assert wait_until(lambda: daemon.settings.cdi_kind == "example.com/gpu")
        response = endpoint.allocate(["sim-gpu-0"]).container_responses[0]
        assert [d.name for d in response.cdi_devices] == ["example.com/gpu=sim-gpu-0"]
    assert runner.result == [0]
    assert sorted(os.listdir(spec_dir)) == ["example.com-gpu.json", "meta-gpu-k8s.io-gpu.json"]
