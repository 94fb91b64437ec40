"""Settings from flags, environment and the official v1 file; bad values name the field."""

from __future__ import annotations

import argparse

import pytest
from gpu_device_plugin.cli import main as cli
from gpu_device_plugin.config import loader
from gpu_device_plugin.config.settings import ConfigError, TimeSlicing

OFFICIAL_STYLE = """
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [envvar, cdi-cri]
    deviceIDStrategy: index
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def parse_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_config_arguments(parser)
    return parser.parse_args(argv)


def load(argv: tuple[str, ...] = (), env: dict[str, str] | None = None, files: dict[str, str] | None = None):
    def read(path: str) -> str:
        if files is None or path not in files:
            raise FileNotFoundError(2, "No such file or directory")
        return files[path]

    return loader.load(parse_args(*argv), env or {}, read)


def test_defaults_match_the_official_plugin_where_names_are_shared() -> None:
    settings, warnings = load()
    assert settings.kubelet_socket == "/var/lib/kubelet/device-plugins/kubelet.sock"
    assert settings.device_discovery_strategy == "auto"
    # ours: the hand-over the node's NVIDIA runtime honours (the official default, envvar, is ignored by an
    # isolating runtime: GPU pods would start without their GPU); cdi.handover decides it at start
    assert settings.device_list_strategy == ("auto",)
    assert settings.device_id_strategy == "uuid"
    assert settings.pass_device_specs is False
    assert settings.fail_on_init_error is False  # ours: keep running on GPU-less nodes
    # the toolkit's feature devices stay off, as in the official plugin
    assert (settings.gds_enabled, settings.mofed_enabled, settings.gdrcopy_enabled) == (False, False, False)
    assert settings.nvswitch_enabled is False
    assert warnings == ()


def test_the_official_feature_flags_load_under_their_names_and_nvswitch_under_ours() -> None:
    text = ("version: v1\nflags:\n  gdsEnabled: true\n  mofedEnabled: true\n  gdrcopyEnabled: false\n"
            "  plugin:\n    nvswitchEnabled: true\n")
    settings, warnings = load(("--config-file", "/c.yaml"), files={"/c.yaml": text})
    assert warnings == ()
    assert (settings.gds_enabled, settings.mofed_enabled, settings.gdrcopy_enabled, settings.nvswitch_enabled) == (
        True, True, False, True)
    from_env, _ = load(env={"MOFED_ENABLED": "true"})
    assert from_env.mofed_enabled is True
    with pytest.raises(ConfigError, match="mofedEnabled.*true or false"):
        load(("--config-file", "/c.yaml"), files={"/c.yaml": "version: v1\nflags:\n  mofedEnabled: sometimes\n"})


def test_the_hand_over_is_auto_alone_or_named_strategies() -> None:
    settings, _ = load(("--device-list-strategy", "auto"))
    assert settings.device_list_strategy == ("auto",)
    with pytest.raises(ConfigError, match="must be auto .* or one or more of envvar"):
        load(("--device-list-strategy", "auto,envvar"))
    with pytest.raises(ConfigError, match="must be auto"):
        load(("--device-list-strategy", "mounts"))


def test_official_config_file_loads_flags_and_time_slicing() -> None:
    settings, warnings = load(("--config-file", "/c.yaml"), files={"/c.yaml": OFFICIAL_STYLE})
    assert settings.fail_on_init_error is True
    assert settings.pass_device_specs is True
    assert settings.device_list_strategy == ("envvar", "cdi-cri")
    assert settings.device_id_strategy == "index"
    assert settings.time_slicing == TimeSlicing(replicas=4, rename_by_default=True, fail_requests_greater_than_one=True)
    assert warnings == ()


def test_flag_beats_env_beats_file() -> None:
    files = {"/c.yaml": "version: v1\nflags:\n  deviceDiscoveryStrategy: nvml\n  plugin:\n    deviceIDStrategy: index\n"
                        "    passDeviceSpecs: true\n"}
    env = {"DEVICE_DISCOVERY_STRATEGY": "tegra", "PASS_DEVICE_SPECS": "false", "CONFIG_FILE": "/c.yaml"}
    settings, _ = load(("--device-discovery-strategy", "auto"), env=env, files=files)
    assert settings.device_discovery_strategy == "auto"  # flag over env over file
    assert settings.pass_device_specs is False  # env over file
    assert settings.device_id_strategy == "index"  # file over default


def test_unsupported_official_fields_are_named_in_one_warning() -> None:
    text = ("version: v1\nflags:\n  nvidiaDriverRoot: /run/nvidia/driver\n  plugin:\n    mpsRoot: /run/mps\n"
            "sharing:\n  mps:\n    resources: []\n")
    _, warnings = load(("--config-file", "/c.yaml"), files={"/c.yaml": text})
    assert len(warnings) == 1
    for field in ("flags.nvidiaDriverRoot", "flags.plugin.mpsRoot", "sharing.mps"):
        assert field in warnings[0]


@pytest.mark.parametrize(
    ("argv", "env", "text", "expected"),
    [
        (("--device-discovery-strategy", "cuda"), {}, None, "--device-discovery-strategy must be one of auto, tegra"),
        ((), {"FAIL_ON_INIT_ERROR": "maybe"}, None, "environment FAIL_ON_INIT_ERROR expected true or false"),
        (("--simulated-gpus", "0", "--device-discovery-strategy", "simulated"), {}, None,
         "--simulated-gpus must be 1..64 with the simulated discovery strategy, got 0"),
        (("--simulated-gpus", "65"), {}, None, "--simulated-gpus must be 1..64 (0: none), got '65'"),
        (("--kubelet-socket", "kubelet.sock"), {}, None, "--kubelet-socket must be an absolute path"),
        ((), {}, "version: v2\n", "'version' must be v1"),
        ((), {}, "version: v1\nflags:\n  plugin:\n    deviceListStrategy: [envvar, magic]\n",
         "flags.plugin.deviceListStrategy must be auto (the hand-over the node's NVIDIA runtime honours) or one or "
         "more of envvar"),
        ((), {}, "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
                 "      replicas: 0\n",
         "sharing.timeSlicing.resources[0].replicas must be 1..256, got 0"),
        ((), {}, "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: amd.com/gpu\n      replicas: 2\n",
         "resources[0].name must be nvidia.com/gpu"),
        ((), {}, "version: v1\nflags: [1, 2\n", "config file /c.yaml line 3 column 1: not valid YAML ("),
        ((), {}, "version: v1\nflags: [1, 2]\n", "config file /c.yaml: flags must be a mapping (e.g. flags: "),
        ((), {}, "version: v1\nsharing: 5\n", "config file /c.yaml: sharing must be a mapping"),
        ((), {}, "version: v1\nflags:\n  plugin: x\n", "flags.plugin must be a mapping (e.g. plugin: {"),
        ((), {}, "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
                 "      replicas: 2\n    - name: nvidia.com/gpu\n      replicas: 4\n",
         "resources[1]: nvidia.com/gpu is already listed at resources[0]; keep one entry"),
        ((), {}, "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
                 "      replicas: \"4\"\n",
         "resources[0].replicas must be a whole number 1..256, got a string ('4'); write it without quotes"),
        (("--device-discovery-strategy", "simulated"), {}, "version: v1\nflags:\n  plugin:\n    simulatedGpus: '2'\n",
         "flags.plugin.simulatedGpus must be a whole number, got a string ('2')"),
        ((), {}, "", "config file /c.yaml is empty: it needs at least 'version: v1'"),
        ((), {}, "# nothing but a comment\n", "is empty"),
        (("--metrics-address", "9402"), {}, None, "--metrics-address must be HOST:PORT"),
        (("--cdi-kind", "example.com/1gpu"), {}, None, "--cdi-kind CDI kind 'example.com/1gpu' must be vendor/class"),
    ],
)
def test_bad_values_are_rejected_naming_the_flag_or_field(argv, env, text, expected) -> None:
    files = None
    if text is not None:
        argv = (*argv, "--config-file", "/c.yaml")
        files = {"/c.yaml": text}
    with pytest.raises(ConfigError) as err:
        load(argv, env=env, files=files)
    assert expected in str(err.value)


def test_missing_config_file_says_which_and_how_to_fix() -> None:
    with pytest.raises(ConfigError, match=r"config file /nope.yaml: cannot read it .*fix the path or drop --config"):
        load(("--config-file", "/nope.yaml"))


def test_missing_config_file_from_the_environment_does_not_blame_a_flag() -> None:
    with pytest.raises(ConfigError) as err:
        load(env={"CONFIG_FILE": "/nope.yaml"})
    assert "unset the CONFIG_FILE environment variable" in str(err.value)
    assert "--config-file" not in str(err.value)


def test_unknown_field_warning_names_each_field_once_with_one_prefix() -> None:
    text = ("version: v1\nsharing:\n  timeSlicing:\n    shuffle: true\n    resources:\n"
            "    - name: nvidia.com/gpu\n      replicas: 2\n      devices: all\n")
    _, warnings = load(("--config-file", "/c.yaml"), files={"/c.yaml": text})
    assert warnings == ("config file /c.yaml: ignoring fields this plugin does not support: "
                        "sharing.timeSlicing.shuffle, sharing.timeSlicing.resources[0].devices",)


def test_empty_sections_mean_defaults() -> None:
    settings, warnings = load(("--config-file", "/c.yaml"), files={"/c.yaml": "version: v1\nflags:\nsharing:\n"})
    assert settings.time_slicing == TimeSlicing() and warnings == ()


def test_durations_accept_units() -> None:
    settings, _ = load(("--health-recovery-period", "500ms"))
    assert settings.health_recovery_period == pytest.approx(0.5)
    settings, _ = load(("--health-recovery-period", "2m"))
    assert settings.health_recovery_period == 120


def test_mig_strategy_none_is_accepted_and_others_refused_since_mig_gpus_are_never_handed_out() -> None:
    settings, warnings = load(("--config-file", "/c.yaml"),
                              files={"/c.yaml": "version: v1\nflags:\n  migStrategy: none\n"})
    assert warnings == () and not hasattr(settings, "mig_strategy"), "nothing acts on it, so nothing keeps it"
    with pytest.raises(ConfigError, match=r"flags\.migStrategy 'mixed' is not supported.*set migStrategy: none"):
        load(("--config-file", "/c.yaml"), files={"/c.yaml": "version: v1\nflags:\n  migStrategy: mixed\n"})
