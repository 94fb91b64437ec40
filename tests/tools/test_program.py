"""`./task`'s command line: invoke's parse errors, made into one line a person can act on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def task(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools/program.py"), "--search-root", str(REPO_ROOT), *args],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("rollout",), "rollout needs --version VALUE (./task rollout --help)"),
        (("rollout", "--version", "1.4.0", "--artifcat-url", "http://x/y.mender"),
         "rollout has no option --artifcat-url; did you mean --artifact-url? (./task rollout --help)"),
        (("rollout", "--versoin", "1.4.0"), "rollout has no option --versoin; did you mean --version?"),
        (("rolout",), "no task or option 'rolout'; did you mean rollout? (./task --list)"),
    ],
)
def test_parse_errors_name_the_option_and_the_closest_match(args: tuple[str, ...], message: str) -> None:
    completed = task(*args)
    assert completed.returncode == 1
    assert completed.stderr.strip() == message or message in completed.stderr
    assert completed.stderr.strip().count("\n") == 0
    assert "positional" not in completed.stderr and "No idea" not in completed.stderr


def test_the_task_script_runs_this_program() -> None:
    script = (REPO_ROOT / "task").read_text()
    assert '"$repo/tools/program.py" --search-root "$repo"' in script
    assert task("--list").returncode == 0
