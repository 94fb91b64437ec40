"""The systemd unit the layer installs never holds boot forever and keeps the watchdog."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "plugin" / "systemd" / "gpu-device-plugin.service"


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def seconds(value: str) -> float:
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def test_start_has_a_finite_timeout_since_ready_comes_when_serving() -> None:
    unit = service()
    assert unit["Type"] == "notify" and unit["NotifyAccess"] == "main"
    assert unit["TimeoutStartSec"] not in ("infinity", "0"), "a never-READY start would hold boot forever"
    assert 0 < seconds(unit["TimeoutStartSec"]) <= 300


def test_watchdog_and_restart_stay() -> None:
    unit = service()
    assert seconds(unit["WatchdogSec"]) > 0
    assert unit["Restart"] == "always"


def test_the_unit_gives_the_plugin_a_cache_directory_for_its_parsed_config() -> None:
    # without it every start imports PyYAML again (config_cache reads $CACHE_DIRECTORY)
    assert service()["CacheDirectory"] == "gpu-device-plugin"
