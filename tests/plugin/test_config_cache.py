"""The parsed config file is kept for the next start: an unchanged file is not parsed (nor
PyYAML imported) again, and anything the store cannot hold exactly is parsed every time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_device_plugin.config import cache as config_cache
from gpu_device_plugin.config import loader
from gpu_device_plugin.config.settings import ConfigError

SRC = Path(__file__).resolve().parents[2] / "plugin" / "src"
TEXT = "version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n"


class CountingParser:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str) -> object:
        self.calls += 1
        import yaml

        return yaml.safe_load(text)


def test_the_same_text_is_read_back_not_parsed_again(tmp_path: Path) -> None:
    parse = CountingParser()
    first = config_cache.document(TEXT, parse, str(tmp_path))
    second = config_cache.document(TEXT, parse, str(tmp_path))
    assert first == second == {"version": "v1", "flags": {"plugin": {"deviceIDStrategy": "index"}}}
    assert parse.calls == 1


def test_a_changed_file_is_parsed_and_replaces_what_was_kept(tmp_path: Path) -> None:
    parse = CountingParser()
    config_cache.document(TEXT, parse, str(tmp_path))
    changed = TEXT.replace("index", "uuid")
    assert config_cache.document(changed, parse, str(tmp_path))["flags"]["plugin"]["deviceIDStrategy"] == "uuid"
    assert config_cache.document(changed, parse, str(tmp_path))["flags"]["plugin"]["deviceIDStrategy"] == "uuid"
    assert parse.calls == 2
    assert json.loads((tmp_path / config_cache.FILE_NAME).read_text())["text"] == changed


@pytest.mark.parametrize("stored", ["{not json", "[1, 2]", '{"text": "version: v1\\n"}', ""])
def test_a_damaged_store_means_a_parse_and_a_fresh_store(tmp_path: Path, stored: str) -> None:
    (tmp_path / config_cache.FILE_NAME).write_text(stored)
    parse = CountingParser()
    assert config_cache.document(TEXT, parse, str(tmp_path))["version"] == "v1"
    assert parse.calls == 1
    assert json.loads((tmp_path / config_cache.FILE_NAME).read_text())["text"] == TEXT


def test_without_a_directory_or_with_one_that_cannot_be_written_nothing_is_kept(tmp_path: Path) -> None:
    parse = CountingParser()
    config_cache.document(TEXT, parse, "")
    config_cache.document(TEXT, parse, "")
    missing = tmp_path / "gone"
    config_cache.document(TEXT, parse, str(missing))
    config_cache.document(TEXT, parse, str(missing))
    assert parse.calls == 4
    assert not missing.exists()


@pytest.mark.parametrize("text", [
    "version: v1\nflags:\n  built: 2026-11-25\n",  # a YAML date
    "version: v1\n1: one\n",  # a non-string key JSON would turn into "1"
    "version: v1\nflags:\n  x: .nan\n",
])
def test_documents_json_would_change_are_never_stored(tmp_path: Path, text: str) -> None:
    parse = CountingParser()
    config_cache.document(text, parse, str(tmp_path))
    config_cache.document(text, parse, str(tmp_path))
    assert parse.calls == 2
    assert not (tmp_path / config_cache.FILE_NAME).exists()


def test_a_syntax_error_is_reported_every_time_and_never_stored(tmp_path: Path) -> None:
    for _ in range(2):
        with pytest.raises(ConfigError, match="not valid YAML"):
            loader.parse_file("version: v1\nflags: [\n", source="f.yaml", cache_dir=str(tmp_path))
    assert not (tmp_path / config_cache.FILE_NAME).exists()


def test_a_stored_document_is_still_checked_like_a_parsed_one(tmp_path: Path) -> None:
    bad = "version: v2\n"
    for _ in range(2):
        with pytest.raises(ConfigError, match="'version' must be v1"):
            loader.parse_file(bad, cache_dir=str(tmp_path))
    assert json.loads((tmp_path / config_cache.FILE_NAME).read_text())["text"] == bad


def test_the_directory_comes_from_systemds_cache_directory() -> None:
    assert config_cache.cache_dir({"CACHE_DIRECTORY": "/var/cache/gpu-device-plugin"}) == "/var/cache/gpu-device-plugin"
    assert config_cache.cache_dir({"CACHE_DIRECTORY": "/var/cache/a:/var/cache/b"}) == "/var/cache/a"
    assert config_cache.cache_dir({}) == ""


def test_a_start_with_an_unchanged_file_does_not_import_pyyaml(tmp_path: Path) -> None:
    """Through config.loader.load, as the unit runs it: the second start reads the store only."""
    config_file = tmp_path / "config.yaml"
    config_file.write_text(TEXT)
    cache = tmp_path / "cache"
    cache.mkdir()
    probe = ("import argparse, os, sys\n"
             "from gpu_device_plugin.cli import main as cli\nfrom gpu_device_plugin.config import loader\n"
             "parser = argparse.ArgumentParser(); cli.add_config_arguments(parser)\n"
             f"args = parser.parse_args(['--config-file', {str(config_file)!r}])\n"
             "settings, _ = loader.load(args, os.environ, lambda p: open(p).read())\n"
             "print(settings.device_id_strategy, 'yaml' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(SRC), "CACHE_DIRECTORY": str(cache)}

    def start() -> str:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert start() == "index True"
    assert start() == "index False"
    config_file.write_text(TEXT.replace("index", "uuid"))
    assert start() == "uuid True"
