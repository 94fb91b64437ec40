"""`test`: the whole suite as CI runs it, leg by leg, with a summary that lists every skipped
test with pytest's own reason (read from its JUnit XML report)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tools import console
from tools.dev import go_conformance, testdeps, venvs
from tools.dev.skips import Skip, counted
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
GO_LEG = "Kubernetes conformance (Go)"  # conformance/ through tools/dev/go_conformance.py


@dataclass
class LegResult:
    name: str
    status: str  # pass, FAIL, INCOMPLETE, PARTIAL, NO TESTS, skipped
    seconds: float
    detail: str = ""
    skips: list[Skip] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        # INCOMPLETE: tests the run was asked for could not run; never a quiet pass.
        return self.status in ("FAIL", "INCOMPLETE")

    @property
    def skipped(self) -> int:
        return sum(skip.count for skip in self.skips)


# What a leg's body reports: its status, a detail line, and the tests pytest skipped.
LegOutcome = tuple[str, str, list[Skip]]


def run_leg(name: str, body: Callable[[], LegOutcome]) -> LegResult:
    console.step(f"leg: {name}")
    started = time.monotonic()
    skips: list[Skip] = []
    try:
        status, detail, skips = body()
    except venvs.MissingInterpreter as missing:
        status, detail = "FAIL", str(missing)
        console.error(detail)
    except subprocess.CalledProcessError as failed:
        status, detail = "FAIL", f"setup command failed: {' '.join(map(str, failed.cmd))}"
        console.error(detail)
    return LegResult(name, status, time.monotonic() - started, detail, skips)


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def read_skips(junit_xml: Path, root: Path = REPO_ROOT) -> list[Skip]:
    """Every skip in pytest's JUnit XML report, counted per file and reason: a test skipped
    while it ran (`pytest.skip`, a `skipif` mark) reads `FILE:LINE: reason`; a module skipped
    while it was collected (`importorskip` at module level) reads `('FILE', LINE, 'Skipped: reason')`."""
    found: list[tuple[str, str, bool]] = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None:
            continue
        text = (skipped.text or "").strip()
        if skipped.get("message") == "collection skipped" and text.startswith("("):
            where, _, reason = ast.literal_eval(text)
            found.append((_relative(where, root), str(reason).removeprefix("Skipped: "), True))
            continue
        where = text.split(":", 1)[0] if ":" in text else case.get("classname", "").replace(".", "/") + ".py"
        found.append((_relative(where, root), skipped.get("message") or text, False))
    return counted(found)


def skip_lines(results: Sequence[LegResult]) -> list[str]:
    """The summary's list: per leg, how many tests were skipped, where and why; a leg that did
    not run at all (no Go, no test directory) is listed with its reason too."""
    lines = []
    for result in results:
        if result.status == "skipped":
            lines.append(f"  {result.name}: the whole leg skipped: {result.detail}")
        if not result.skips:
            continue
        lines.append(f"  {result.name}: {result.skipped} skipped")
        for skip in result.skips:
            what = "module skipped" if skip.module else f"{skip.count} x"
            lines.append(f"    {what} {skip.where}: {skip.reason}")
    return lines


def pytest_status(code: int) -> tuple[str, str]:
    if code == 0:
        return "pass", ""
    if code == PYTEST_NO_TESTS:
        return "NO TESTS", "pytest collected no tests"
    return "FAIL", f"pytest exit {code}"


def run_pytest(python: str, paths: Sequence[str], env: Mapping[str, str] | None = None) -> LegOutcome:
    existing = [p for p in paths if (REPO_ROOT / p).is_dir()]
    if not existing:
        return "skipped", f"{', '.join(paths)} not there yet", []
    with tempfile.TemporaryDirectory(prefix="gpu-k8s-suite-") as scratch:
        report = Path(scratch) / "junit.xml"
        # -rs: pytest's own list of skips and reasons at the end of the leg's output
        argv = [python, "-m", "pytest", *existing, "-q", "-rs", f"--junitxml={report}"]
        console.info("running: " + " ".join(argv))
        full_env = {**os.environ, **(env or {})}
        code = subprocess.run(argv, cwd=REPO_ROOT, env=full_env, check=False).returncode
        skips = read_skips(report) if report.is_file() else []
    status, detail = pytest_status(code)
    missing = sorted(set(paths) - set(existing))
    if missing:
        detail = (detail + "; " if detail else "") + f"not there yet: {', '.join(missing)}"
    return status, detail, skips


def ruff_leg() -> LegOutcome:
    from tools.dev.lint import run_ruff

    result = run_ruff()
    return result.status, result.detail, []


def tools_leg(host_setup: bool = True) -> LegOutcome:
    setup = testdeps.qemu_test_setup(host_setup)
    status, detail, skips = run_pytest(sys.executable, ["tests/tools", "tests/layer"], setup.env)
    return (*with_qemu_verdict(status, detail, setup), skips)


def with_qemu_verdict(status: str, detail: str, setup: testdeps.QemuTestSetup) -> tuple[str, str]:
    """A leg whose QEMU tests (or the tests needing the host tools the setup installs) were
    skipped never reads "pass": INCOMPLETE (a failure) when the host setup that would have let
    them run failed, PARTIAL under --no-host-setup."""
    notes = [note for note in (f"QEMU tests skipped: {setup.skipped}" if setup.skipped else "",
                               f"tests needing host tools skipped: {setup.tools_missing}" if setup.tools_missing
                               else "") if note]
    if not notes or status != "pass":
        return status, "; ".join(part for part in (detail, *notes) if part)
    if setup.asked:
        return "INCOMPLETE", (f"{'; '.join(notes)}; fix that and run again, or "
                              "./task test --no-host-setup to run without them")
    return "PARTIAL", "; ".join(notes)


def plugin_leg(combination: PluginCombination) -> Callable[[], LegOutcome]:
    def body() -> LegOutcome:
        python = venvs.ensure_venv(combination.venv())
        status, detail, skips = run_pytest(str(python), ["tests/plugin"])
        versions = f"Python {combination.python_version}, {combination.requirements}"
        return status, f"{versions}{'; ' + detail if detail else ''}", skips

    return body


def updater_leg(combination: PluginCombination) -> Callable[[], LegOutcome]:
    """The node's update agent is standard library only; it runs on the board's Python, so
    it is tested on that interpreter (the plugin's oldest venv already has it and pytest)."""

    def body() -> LegOutcome:
        python = venvs.ensure_venv(combination.venv())
        status, detail, skips = run_pytest(str(python), ["tests/updater"])
        return status, f"Python {combination.python_version}{'; ' + detail if detail else ''}", skips

    return body


def go_leg(board_python: PluginCombination) -> Callable[[], LegOutcome]:
    """The Go harness, our plugin in it on the board's interpreter; its skips as go test reports them."""

    def body() -> LegOutcome:
        return go_conformance.leg(lambda: venvs.ensure_venv(board_python.venv()))

    return body


def run_suite(quick: bool = False, host_setup: bool = True) -> list[LegResult]:
    legs: list[tuple[str, Callable[[], LegOutcome]]] = [
        ("ruff", ruff_leg),
        ("tools + layer tests", lambda: tools_leg(host_setup)),
    ]
    board_python = PLUGIN_COMBINATIONS[-1] if quick else PLUGIN_COMBINATIONS[0]
    # our plugin (on the board's stack) and the DRA harness against Kubernetes' own Go code; before
    # the plugin legs, so that their benchmark test only links what this leg compiled
    legs.append((GO_LEG, go_leg(board_python)))
    for combination in PLUGIN_COMBINATIONS:
        if quick and combination.name in QUICK_SKIPS:
            continue
        legs.append((f"plugin on {combination.name}", plugin_leg(combination)))
    legs.append((f"updater on Python {board_python.python_version}", updater_leg(board_python)))
    results = [run_leg(name, body) for name, body in legs]
    rows = [[r.name, r.status, f"{r.seconds:.0f}", str(r.skipped), r.detail] for r in results]
    console.summary("test summary", ["leg", "result", "seconds", "skipped", "detail"], rows)
    listed = skip_lines(results)
    print("\nskipped, with the reasons pytest and go test give:" if listed else "\nno test was skipped", flush=True)
    if listed:
        print("\n".join(listed), flush=True)
    if quick:
        console.info("note: --quick skipped the Python 3.10 plugin legs (the image's and stock kirkstone's libraries)")
    return results
