"""tasks.py wiring, lint's kas schema check, venv bookkeeping and the suite's verdicts."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Collection

import tasks
from tools.dev import lint, suite, venvs

REPO_ROOT = Path(__file__).resolve().parents[2]


def all_tasks() -> dict:
    collection = Collection.from_module(tasks)
    return {name: collection[name] for name in collection.task_names}


def test_every_task_has_a_docstring_and_every_argument_has_help() -> None:
    found = all_tasks()
    assert set(found) == {"build", "check-image", "flash", "smoke-test", "lint", "test", "rollout", "release",
                          "status"}
    for name, task in found.items():
        assert task.body.__doc__ and task.body.__doc__.strip(), f"{name} has no docstring"
        parameters = [p for p in inspect.signature(task.body).parameters if p != "c"]
        documented = {key.replace("-", "_") for key in task.help}
        missing = [p for p in parameters if p not in documented]
        assert not missing, f"{name}: arguments without help text: {missing}"


def test_invoke_help_shows_the_docstring_and_options() -> None:
    output = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), "--help", "flash"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Flash a Jetson in USB recovery mode, or write an SD card, NVMe drive or x86-64 disk." in output
    assert "--force-device" in output and "--dry-run" in output


def test_kas_schema_check_reports_the_bad_key(tmp_path: Path) -> None:
    good = tmp_path / "good.yml"
    good.write_text("header:\n  version: 14\nmachine: qemux86-64\ndistro: poky\ntarget: core-image-minimal\n")
    bad = tmp_path / "bad.yml"
    bad.write_text("header:\n  version: 14\nmachine: 42\nrepos:\n  poky:\n    layerz: {}\n")
    assert lint.kas_schema_errors(good) == []
    errors = lint.kas_schema_errors(bad)
    assert any(error.startswith("machine:") for error in errors), errors
    assert any("layerz" in error for error in errors), errors


def test_lint_skips_missing_layer_and_kas_dirs_with_a_note(tmp_path: Path) -> None:
    assert [r.status for r in lint.run_oelint(tmp_path)] == ["skipped"]
    result = lint.run_kas_schema(tmp_path)
    assert result.status == "skipped" and "kas/" in result.detail


def test_oelint_runs_once_per_series_the_layer_declares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "meta-gpu-k8s" / "conf"
    conf.mkdir(parents=True)
    (conf / "layer.conf").write_text('LAYERSERIES_COMPAT_x = "kirkstone wrynose"\n')
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **_: object) -> subprocess.CompletedProcess:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1 if "wrynose" in argv else 0)

    monkeypatch.setattr(lint.subprocess, "run", fake_run)
    results = lint.run_oelint(tmp_path)
    assert [(r.name, r.status) for r in results] == [("oelint-adv kirkstone", "pass"), ("oelint-adv wrynose", "FAIL")]
    assert [argv[argv.index("--release") + 1] for argv in calls] == ["kirkstone", "wrynose"]
    # inherit_defer does not exist on kirkstone: only the newer series' run suppresses it
    assert "oelint.var.inherit.inherit_defer" not in calls[0] and "oelint.var.inherit.inherit_defer" in calls[1]


def test_oelint_without_a_declared_series_fails_naming_the_variable(tmp_path: Path) -> None:
    conf = tmp_path / "meta-gpu-k8s" / "conf"
    conf.mkdir(parents=True)
    (conf / "layer.conf").write_text('BBFILE_COLLECTIONS += "x"\n')
    [result] = lint.run_oelint(tmp_path)
    assert result.status == "FAIL" and "LAYERSERIES_COMPAT" in result.detail


def test_pytest_collecting_nothing_is_reported_not_hidden() -> None:
    assert suite.pytest_status(0) == ("pass", "")
    assert suite.pytest_status(5)[0] == "NO TESTS"
    assert suite.pytest_status(1)[0] == "FAIL"


def test_missing_interpreter_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(venvs, "interpreter_candidates", lambda version: ["/nonexistent/python3.99"])
    with pytest.raises(venvs.MissingInterpreter, match=r"Python 3.99 not found.*pyenv install 3.99"):
        venvs.find_interpreter("3.99")


def test_interpreter_is_asked_for_its_version_not_trusted_by_name(tmp_path: Path) -> None:
    liar = tmp_path / "python3.10"
    liar.write_text("#!/bin/sh\necho 'pyenv: python3.10: command not found' >&2\nexit 127\n")
    liar.chmod(0o755)
    assert venvs.interpreter_version(str(liar)) is None
    assert venvs.interpreter_version(sys.executable) == sys.version_info[:2]


def test_venv_goes_stale_when_its_requirements_change(tmp_path: Path) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("grpcio==1.45.0\n")
    spec = venvs.VenvSpec(tmp_path / "venv", "3.10", [requirements], ("pytest",))
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text("")
    spec.stamp.write_text(spec.fingerprint())
    assert venvs.is_current(spec)
    requirements.write_text("grpcio==1.46.0\n")
    assert not venvs.is_current(spec)


def test_kvm_and_no_kvm_together_are_refused_before_anything_runs() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), "smoke-test", "--kvm", "--no-kvm"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 2
    assert "--kvm and --no-kvm exclude each other" in completed.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["smoke-test", "--port", "abc"], "error: --port must be a whole number >= 1, got 'abc'"),
        (["smoke-test", "--memory-mib", "-5"], "error: --memory-mib must be a whole number >= 1, got '-5'"),
        (["smoke-test", "--gpus", "two"], "error: --gpus must be a whole number >= 0, got 'two'"),
        (["build", "--min-free-gb", "lots"], "error: --min-free-gb must be a whole number >= 0, got 'lots'"),
        (["build", "--threads", "0", "--dry-run"], "error: --threads must be a whole number >= 1, got '0'"),
    ],
)
def test_bad_numbers_are_one_line_errors_not_tracebacks(argv: list[str], message: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), *argv],
        capture_output=True, text=True, check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [message]
    assert "Traceback" not in completed.stdout


def test_plugin_legs_cover_every_library_combination_an_image_ships() -> None:
    # kirkstone's protobuf 3.20 with grpcio 1.45 and 1.66, and wrynose's grpcio 1.78 / protobuf 6.33:
    # the plugin's message classes are built at run time and must load on every one of them
    pins: dict[str, dict[str, str]] = {}
    for combination in suite.PLUGIN_COMBINATIONS:
        lines = (REPO_ROOT / combination.requirements).read_text().splitlines()
        pins[combination.name] = dict(line.split("==", 1) for line in lines if "==" in line)
    assert pins["oldest"]["protobuf"].startswith("3.20.") and pins["oldest"]["grpcio"].startswith("1.66.")
    assert pins["kirkstone"]["grpcio"].startswith("1.45.")
    assert pins["wrynose"]["grpcio"].startswith("1.78.") and pins["wrynose"]["protobuf"].startswith("6.33.")
    # hpack as each series' meta-python ships it (python3-hpack: 4.0.0 on kirkstone, 4.1.0 on wrynose)
    assert pins["oldest"]["hpack"] == pins["kirkstone"]["hpack"] == "4.0.0" and pins["wrynose"]["hpack"] == "4.1.0"
    assert "hpack" in pins["newest"]
    # the proto compiler the schema test uses must run on the leg's protobuf
    assert pins["wrynose"]["grpcio-tools"].startswith("1.78.")
    assert {c.name for c in suite.PLUGIN_COMBINATIONS if c.name not in suite.QUICK_SKIPS} >= {"wrynose", "newest"}
