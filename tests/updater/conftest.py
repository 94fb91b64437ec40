"""The agent's tests run against updater/src, on the board's Python (3.10) and the newest."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
UPDATER_SRC = TESTS.parents[1] / "updater" / "src"
# The repository root too: the Orin tests provision a node with ./task flash's own code (tools/).
for path in (str(UPDATER_SRC), str(TESTS), str(TESTS.parents[1])):
    if path not in sys.path:
        sys.path.insert(0, path)

from fake_board import Board, HealthServer  # noqa: E402


@pytest.fixture()
def board(tmp_path: Path) -> Board:
    return Board(tmp_path / "board")


@pytest.fixture()
def kubelet() -> Iterator[HealthServer]:
    server = HealthServer().start()
    yield server
    server.stop()
