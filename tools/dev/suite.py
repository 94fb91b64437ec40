"""`test`: the whole suite as CI runs it, leg by leg, with a summary."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import console
from tools.dev import go_conformance, testdeps, venvs
from tools.paths import REPO_ROOT, VENVS_DIR

PYTEST_NO_TESTS = 5  # pytest's exit code when it collected nothing


@dataclass(frozen=True)
class PluginCombination:
    """One interpreter + library versions the plugin must work on."""

    name: str
    python_version: str
    requirements: str  # relative to the repo root

    def venv(self, root: Path = REPO_ROOT) -> venvs.VenvSpec:
        return venvs.VenvSpec(
            path=VENVS_DIR / f"plugin-{self.name}",
            python_version=self.python_version,
            requirement_files=[root / self.requirements],
            packages=("pytest",),
        )


PLUGIN_COMBINATIONS = (
    # kirkstone's Python with the image's hpack; grpcio 1.66 + protobuf 3.20 as the test clients
    PluginCombination("oldest", "3.10", "plugin/requirements-oldest.txt"),
    # kirkstone's Python and stock kirkstone grpcio 1.45 as the test client
    PluginCombination("kirkstone", "3.10", "plugin/requirements-kirkstone.txt"),
    # what a Yocto 6.0 wrynose image ships (grpcio 1.78, protobuf 6.33); wrynose's Python is 3.14,
    # this runs on the newest Python the test host has (3.13 here)
    PluginCombination("wrynose", "3.13", "plugin/requirements-wrynose.txt"),
    PluginCombination("newest", "3.13", "plugin/requirements-newest.txt"),
)

QUICK_SKIPS = ("oldest", "kirkstone")  # both Python 3.10: the slowest venvs to make


@dataclass
class LegResult:
    name: str
    status: str  # pass, FAIL, INCOMPLETE, PARTIAL, NO TESTS, skipped
    seconds: float
    detail: str = ""

    @property
    def failed(self) -> bool:
        # INCOMPLETE: tests the run was asked for could not run; never a quiet pass.
        return self.status in ("FAIL", "INCOMPLETE")


def run_leg(name: str, body: Callable[[], tuple[str, str]]) -> LegResult:
    console.step(f"leg: {name}")
    started = time.monotonic()
    try:
        status, detail = body()
    except venvs.MissingInterpreter as missing:
        status, detail = "FAIL", str(missing)
        console.error(detail)
    except subprocess.CalledProcessError as failed:
        status, detail = "FAIL", f"setup command failed: {' '.join(map(str, failed.cmd))}"
        console.error(detail)
    return LegResult(name, status, time.monotonic() - started, detail)


def pytest_status(code: int) -> tuple[str, str]:
    if code == 0:
        return "pass", ""
    if code == PYTEST_NO_TESTS:
        return "NO TESTS", "pytest collected no tests"
    return "FAIL", f"pytest exit {code}"


def run_pytest(python: str, paths: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[str, str]:
    existing = [p for p in paths if (REPO_ROOT / p).is_dir()]
    if not existing:
        return "skipped", f"{', '.join(paths)} not there yet"
    argv = [python, "-m", "pytest", *existing, "-q"]
    console.info("running: " + " ".join(argv))
    full_env = {**os.environ, **(env or {})}
    code = subprocess.run(argv, cwd=REPO_ROOT, env=full_env, check=False).returncode
    status, detail = pytest_status(code)
    missing = sorted(set(paths) - set(existing))
    if missing:
        detail = (detail + "; " if detail else "") + f"not there yet: {', '.join(missing)}"
    return status, detail


def ruff_leg() -> tuple[str, str]:
    from tools.dev.lint import run_ruff

    result = run_ruff()
    return result.status, result.detail


def tools_leg(host_setup: bool = True) -> tuple[str, str]:
    setup = testdeps.qemu_test_setup(host_setup)
    status, detail = run_pytest(sys.executable, ["tests/tools", "tests/layer"], setup.env)
    return with_qemu_verdict(status, detail, setup)


def with_qemu_verdict(status: str, detail: str, setup: testdeps.QemuTestSetup) -> tuple[str, str]:
    """A leg whose QEMU tests were skipped never reads "pass": INCOMPLETE (a failure) when
    the host setup that would have let them run failed, PARTIAL under --no-host-setup."""
    if not setup.skipped or status != "pass":
        note = f"QEMU tests skipped: {setup.skipped}" if setup.skipped else ""
        return status, "; ".join(part for part in (detail, note) if part)
    if setup.asked:
        return "INCOMPLETE", (f"QEMU tests skipped: {setup.skipped}; fix that and run again, or "
                              "./task test --no-host-setup to run without them")
    return "PARTIAL", f"QEMU tests skipped: {setup.skipped}"


def plugin_leg(combination: PluginCombination) -> Callable[[], tuple[str, str]]:
    def body() -> tuple[str, str]:
        python = venvs.ensure_venv(combination.venv())
        status, detail = run_pytest(str(python), ["tests/plugin"])
        versions = f"Python {combination.python_version}, {combination.requirements}"
        return status, f"{versions}{'; ' + detail if detail else ''}"

    return body


def updater_leg(combination: PluginCombination) -> Callable[[], tuple[str, str]]:
    """The node's update agent is standard library only; it runs on the board's Python, so
    it is tested on that interpreter (the plugin's oldest venv already has it and pytest)."""

    def body() -> tuple[str, str]:
        python = venvs.ensure_venv(combination.venv())
        status, detail = run_pytest(str(python), ["tests/updater"])
        return status, f"Python {combination.python_version}{'; ' + detail if detail else ''}"

    return body


def run_suite(quick: bool = False, host_setup: bool = True) -> list[LegResult]:
    legs: list[tuple[str, Callable[[], tuple[str, str]]]] = [
        ("ruff", ruff_leg),
        ("tools + layer tests", lambda: tools_leg(host_setup)),
    ]
    board_python = PLUGIN_COMBINATIONS[-1] if quick else PLUGIN_COMBINATIONS[0]
    # our plugin (on the board's stack) and the DRA harness against Kubernetes' own Go code; before
    # the plugin legs, so that their benchmark test only links what this leg compiled
    legs.append(("Kubernetes conformance (Go)",
                 lambda: go_conformance.leg(lambda: venvs.ensure_venv(board_python.venv()))))
    for combination in PLUGIN_COMBINATIONS:
        if quick and combination.name in QUICK_SKIPS:
            continue
        legs.append((f"plugin on {combination.name}", plugin_leg(combination)))
    legs.append((f"updater on Python {board_python.python_version}", updater_leg(board_python)))
    results = [run_leg(name, body) for name, body in legs]
    rows = [[r.name, r.status, f"{r.seconds:.0f}", r.detail] for r in results]
    console.summary("test summary", ["leg", "result", "seconds", "detail"], rows)
    if quick:
        console.info("note: --quick skipped the Python 3.10 plugin legs (the image's and stock kirkstone's libraries)")
    return results
