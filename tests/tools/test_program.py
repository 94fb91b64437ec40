"""`./task`'s command line: invoke's parse errors, made into one line a person can act on."""

from __future__ import annotations

import os
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
    assert completed.returncode == 2
    assert completed.stderr.strip() == message or message in completed.stderr
    assert completed.stderr.strip().count("\n") == 0
    assert "positional" not in completed.stderr and "No idea" not in completed.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("rollout", "--help"),  # rollout's version is required: invoke took --help for it and ran the task
        ("rollout", "-h"),
        ("rollout", "--version", "1.4.0", "--help"),
        ("flash", "--machine", "jetson-agx-thor", "--help"),
        ("release", "--help"),
    ],
)
def test_help_after_the_task_name_prints_that_tasks_help_and_runs_nothing(args: tuple[str, ...]) -> None:
    completed = task(*args)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"Usage: ./task [--core-opts] {args[0]} ")
    assert "Docstring:" in completed.stdout and "Options:" in completed.stdout
    assert completed.stderr == ""


def test_an_option_the_task_lacks_is_named_even_where_invoke_keeps_it_for_itself() -> None:
    # invoke reads --version as its own flag and complains about the value after it
    completed = task("release", "--version", "1.0.0")
    assert completed.returncode == 2
    assert completed.stderr.strip() == "release has no option --version (./task release --help)"


def test_the_task_script_runs_this_program() -> None:
    script = (REPO_ROOT / "task").read_text()
    assert '"$repo/tools/program.py" --search-root "$repo"' in script
    assert task("--list").returncode == 0


# One bad value per task, as a person would type it: each is a usage error, exit status 2,
# one line on stderr, and nothing ran (tools/usage.py). Refusals of a valid command exit 1.
USAGE_ERRORS = [
    (("build", "--machine", "rpi4", "--dry-run"), "error: unknown machine 'rpi4'"),
    (("build", "--role", "master", "--dry-run"), "error: --role must be server or agent, got 'master'"),
    (("build", "--threads", "many", "--dry-run"), "error: --threads must be a whole number >= 1"),
    (("check-image", "--machine", "rpi4"), "error: unknown machine 'rpi4'"),
    (("check-image", "--kas", "kas/nope.yml"), "error: kas file kas/nope.yml does not exist"),
    (("check-image", "--role", "worker"), "error: --role must be server or agent"),
    (("flash", "--machine", "qemu"), "error: --machine 'qemu' cannot be flashed"),
    (("flash", "--method", "dd"), "error: unknown --method 'dd'"),
    (("flash", "--role", "agent"), "error: --role agent needs --server-url"),
    (("flash", "--machine", "x86-64"), "error: --machine x86-64 writes the node's disk image to a drive: give "
                                       "--device"),
    (("flash", "--sd-image", "x.sdcard", "--device", "/tmp/x.img"), "error: --device /tmp/x.img is"),
    (("flash", "--sd-image", "x.sdcard", "--method", "sdcard", "--device", "/dev/sdb"),
     "error: --method sdcard and --sd-image exclude each other: --sd-image writes the image file as it is"),
    (("flash", "--machine", "jetson-orin-nano", "--server-url", "https://k3s-server.lan", "--token-file", "token"),
     "error: --server-url 'https://k3s-server.lan' has no port: k3s's API listens on 6443, so give "
     "https://k3s-server.lan:6443"),
    (("flash", "--label", "site=lab-2", "--label", "--dry-run"),
     "flash --label needs a value each time it is given: --label VALUE"),
    (("flash", "--label"), "flash --label needs a value each time it is given"),
    (("smoke-test", "--runtime", "podman"), "error: --runtime must be auto, docker or containerd"),
    (("smoke-test", "--image", "x.ext4", "--host", "root@192.168.1.50"),
     "error: --image and --host exclude each other: boot an image in QEMU, or test a board"),
    (("smoke-test", "--image", "gpu-k8s-image-jetson-nano-devkit.sdcard"), "is a jetson-nano-devkit image"),
    (("release", "--kas", "kas/nope.yml"), "error: --kas kas/nope.yml: not one of our kas files"),
    (("rollout", "--version", "1.4.0", "--ring", "half", "--artifact-url", "http://u/a.mender", "--device-type",
      "x", "--dry-run"), "error: --ring must be one of server, canary, fleet, all"),
    (("rollout", "--version", "1.4.0", "--release", "build/release/1.4.0", "--base-url", "updates.lan:8080"),
     "error: --base-url 'updates.lan:8080' must be an http(s) URL"),
    (("rollout", "--versoin", "1.4.0"), "rollout has no option --versoin"),
    (("no-such-task",), "no task or option 'no-such-task'"),
    (("--no-such-flag",), "no task or option '--no-such-flag'"),
]


@pytest.mark.parametrize(("args", "says"), USAGE_ERRORS, ids=[" ".join(args) for args, _ in USAGE_ERRORS])
def test_every_task_exits_2_on_a_usage_error_with_one_line(args: tuple[str, ...], says: str, tmp_path) -> None:
    completed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools/program.py"), "--search-root", str(REPO_ROOT), *args],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
        env={**os.environ, "GPU_K8S_BUILD_ROOT": str(tmp_path / "build"), "PATH": os.environ["PATH"]},
    )
    assert (completed.returncode, completed.stderr.strip().count("\n")) == (2, 0), completed.stderr
    assert says in completed.stderr, completed.stderr
    assert "Traceback" not in completed.stdout + completed.stderr


def test_the_program_uses_the_tasks_usage_status() -> None:
    from tools import program, usage

    assert program.USAGE_EXIT == usage.EXIT_USAGE == 2 and usage.EXIT_REFUSED == 1


def test_the_first_run_without_pypi_says_what_it_needs_and_leaves_no_half_venv(tmp_path) -> None:
    import shutil

    shutil.copy(REPO_ROOT / "task", tmp_path / "task")
    (tmp_path / "requirements").mkdir()
    shutil.copy(REPO_ROOT / "requirements/tools.txt", tmp_path / "requirements/tools.txt")
    offline = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}
    completed = subprocess.run([str(tmp_path / "task"), "--list"], capture_output=True, text=True, timeout=300,
                               check=False, env=offline)
    assert completed.returncode == 1
    assert "error: pip could not install the tooling (requirements/tools.txt) into .venvs/tools." in completed.stderr
    assert "PIP_INDEX_URL" in completed.stderr and "Traceback" not in completed.stderr
    assert not (tmp_path / ".venvs" / "tools").exists(), "the next run starts over"
