"""A socket path that can never be bound is a start error with its reason, not a retry loop."""

from __future__ import annotations

import os
from pathlib import Path

from gpu_device_plugin.session.socket_check import MAX_SOCKET_PATH_BYTES, socket_path_problem


def test_a_usable_directory_has_no_problem(tmp_path: Path) -> None:
    assert socket_path_problem(str(tmp_path / "nvidia-gpu.sock")) == ""


def test_a_path_over_the_unix_limit_is_named_with_its_length(tmp_path: Path) -> None:
    path = "/" + "d" * (MAX_SOCKET_PATH_BYTES - 1 - len("/nvidia-gpu.sock")) + "/nvidia-gpu.sock"
    assert len(path) == MAX_SOCKET_PATH_BYTES
    assert socket_path_problem(path, access=lambda *_: True) == ""  # exactly at the limit: fine
    longer = "/d" + path
    problem = socket_path_problem(longer, access=lambda *_: True)
    assert f"is {MAX_SOCKET_PATH_BYTES + 2} bytes, over the Unix limit of {MAX_SOCKET_PATH_BYTES}" in problem


def test_an_unwritable_directory_is_named(tmp_path: Path) -> None:
    asked: list[tuple[str, int]] = []

    def access(path: str, mode: int) -> bool:
        asked.append((path, mode))
        return False

    problem = socket_path_problem(str(tmp_path / "nvidia-gpu.sock"), access=access)
    assert asked == [(str(tmp_path), os.W_OK | os.X_OK)]
    assert problem.startswith(f"cannot create sockets in {tmp_path} (not writable")
