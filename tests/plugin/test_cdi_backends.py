"""CDI on NVML nodes is refused with the fix named: a spec of bare device nodes breaks CUDA."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace

import pytest
from gpu_device_plugin import cli, config
from gpu_device_plugin.config import ConfigError, Settings
from gpu_device_plugin.daemon import Daemon
from gpu_device_plugin.discovery.base import Probe
from gpu_device_plugin.discovery.select import Choice
from gpu_device_plugin.model import Gpu
from helpers import RunningDaemon, simulated_settings, wait_until
from kubelet_double import KubeletDouble


def test_explicit_nvml_with_a_cdi_strategy_is_refused_at_config_time_naming_the_fix() -> None:
    with pytest.raises(ConfigError) as refused:
        config.build({"device_discovery_strategy": "nvml", "device_list_strategy": ("envvar", "cdi-cri")}, {}, None)
    message = str(refused.value)
    assert message.startswith("--device-list-strategy cdi-cri is not supported for NVML")
    assert "use envvar or volume-mounts" in message and "\n" not in message


def test_the_refusal_names_the_file_field_when_the_file_set_it() -> None:
    text = "version: v1\nflags:\n  deviceDiscoveryStrategy: nvml\n  plugin:\n    deviceListStrategy: cdi-annotations\n"
    with pytest.raises(ConfigError, match=r"^config file flags\.plugin\.deviceListStrategy cdi-annotations"):
        config.build({}, {}, config.parse_file(text))


@pytest.mark.parametrize("backend", ["tegra", "simulated"])
def test_cdi_stays_allowed_where_the_spec_is_complete(backend: str) -> None:
    settings = Settings(device_list_strategy=("cdi-cri",))
    assert config.backend_conflict(settings, backend) is None
    assert config.backend_conflict(replace(settings, device_list_strategy=("envvar",)), "nvml") is None


class NvmlLookalike:
    name = "nvml"

    def probe(self) -> Probe:
        return Probe(True, "fake discrete GPU")

    def discover(self) -> list[Gpu]:
        return [Gpu(id="GPU-0f0e", index=0, name="Tesla T4", backend="nvml", device_nodes=("/dev/nvidia0",))]


def test_auto_discovery_finding_nvml_gpus_with_cdi_on_exits_2(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cli, "choose", lambda settings: Choice(NvmlLookalike(), "auto chose nvml"))
    with caplog.at_level(logging.ERROR):
        code = cli.serve(Settings(device_list_strategy=("cdi-cri",)), argparse.Namespace())
    assert code == 2
    assert any("not supported for NVML" in r.getMessage() for r in caplog.records)


def test_a_reload_turning_cdi_on_for_nvml_gpus_is_rejected(socket_dir: str, kubelet: KubeletDouble) -> None:
    settings = simulated_settings(socket_dir)
    new = replace(settings, device_list_strategy=("cdi-cri",))
    daemon = Daemon(settings, NvmlLookalike().discover(), None, reload_settings=lambda: new, environ={})
    with RunningDaemon(daemon):
        kubelet.wait_registered()
        daemon.request_reload()
        assert wait_until(lambda: daemon.stats.config_rejections == 1)
        assert daemon.settings.device_list_strategy == ("envvar",)
