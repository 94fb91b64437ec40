"""Plugin tests run against the source tree, on every Python/grpcio/protobuf combination CI uses."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PLUGIN_SRC = Path(__file__).resolve().parents[2] / "plugin" / "src"
if str(PLUGIN_SRC) not in sys.path:
    sys.path.insert(0, str(PLUGIN_SRC))


@pytest.fixture()
def socket_dir() -> Iterator[str]:
    """A short temporary directory: Unix socket paths are limited to 107 bytes."""
    path = tempfile.mkdtemp(prefix="gdp-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def kubelet(socket_dir: str) -> Iterator[object]:
    """A running kubelet double whose socket directory is `socket_dir`."""
    from kubelet_double import KubeletDouble

    double = KubeletDouble(socket_dir)
    double.start()
    yield double
    double.stop()


@pytest.fixture()
def no_plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process CLI runs see no plugin setting from the environment running the tests."""
    from gpu_device_plugin.config import loader

    for option in loader.OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    monkeypatch.delenv("CONFIG_FILE", raising=False)
