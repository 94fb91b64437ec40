"""./task test's summary: every skipped test with its runner's own reason, per leg (pytest's
read from the JUnit XML report of a real pytest run, go test's from its events), and every leg
that did not run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.dev import suite

SKIPPING_TESTS = {
    "test_marked.py": "import pytest\n"
                      "pytestmark = pytest.mark.skipif(True, reason='opt-in: set SOMETHING to run it')\n"
                      "def test_one(): pass\n"
                      "def test_two(): pass\n",
    "test_collected.py": "import pytest\n"
                         "pytest.importorskip('no_such_module_here', reason='only in the wrynose venv')\n"
                         "def test_three(): pass\n",
    "test_inside.py": "import pytest\n"
                      "@pytest.mark.parametrize('n', [1, 2])\n"
                      "def test_four(n): pytest.skip('needs a readable /dev/kmsg')\n"
                      "def test_runs(): pass\n",
}


def junit_report(tmp_path: Path) -> Path:
    tests = tmp_path / "tests"
    tests.mkdir()
    for name, text in SKIPPING_TESTS.items():
        (tests / name).write_text(text)
    report = tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider",
                           f"--junitxml={report}"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return report


def test_skips_are_read_from_pytests_own_report_per_file_and_reason(tmp_path: Path) -> None:
    skips = suite.read_skips(junit_report(tmp_path), root=tmp_path)
    assert skips == [
        suite.Skip("tests/test_collected.py", "only in the wrynose venv", 1, module=True),
        suite.Skip("tests/test_inside.py", "needs a readable /dev/kmsg", 2),
        suite.Skip("tests/test_marked.py", "opt-in: set SOMETHING to run it", 2),
    ]


def test_the_summary_lists_each_legs_skips_with_their_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    skips = suite.read_skips(junit_report(tmp_path), root=tmp_path)
    monkeypatch.setattr(suite, "ruff_leg", lambda: ("pass", "", []))
    monkeypatch.setattr(suite, "tools_leg", lambda host_setup: ("pass", "", skips))
    monkeypatch.setattr(suite, "plugin_leg", lambda combination: lambda: ("pass", combination.name, []))
    monkeypatch.setattr(suite, "updater_leg", lambda combination: lambda: ("pass", "", skips[:1]))
    go_skips = [suite.Skip("conformance/dra/dra_test.go", "needs CAP_SYS_ADMIN", 2)]
    monkeypatch.setattr(suite, "go_leg", lambda combination: lambda: ("pass", "", go_skips))
    results = suite.run_suite(quick=True)
    assert [r.name for r in results][2] == "Kubernetes conformance (Go)"
    assert [r.skipped for r in results] == [0, 5, 2, 0, 0, 1]
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("leg "))
    assert header.split() == ["leg", "result", "seconds", "skipped", "detail"]
    listing = out.split("skipped, with the reasons pytest and go test give:\n", 1)[1].splitlines()
    assert listing[:8] == [
        "  tools + layer tests: 5 skipped",
        "    module skipped tests/test_collected.py: only in the wrynose venv",
        "    2 x tests/test_inside.py: needs a readable /dev/kmsg",
        "    2 x tests/test_marked.py: opt-in: set SOMETHING to run it",
        "  Kubernetes conformance (Go): 2 skipped",
        "    2 x conformance/dra/dra_test.go: needs CAP_SYS_ADMIN",
        "  updater on Python 3.13: 1 skipped",
        "    module skipped tests/test_collected.py: only in the wrynose venv",
    ]


def test_a_leg_that_did_not_run_is_listed_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Go leg without Go (or an older one) runs no test at all: the list says so, not 'no test was skipped'."""
    monkeypatch.setattr(suite, "ruff_leg", lambda: ("pass", "", []))
    monkeypatch.setattr(suite, "tools_leg", lambda host_setup: ("pass", "", []))
    monkeypatch.setattr(suite, "plugin_leg", lambda combination: lambda: ("pass", "", []))
    monkeypatch.setattr(suite, "updater_leg", lambda combination: lambda: ("pass", "", []))
    monkeypatch.setattr(suite.go_conformance.shutil, "which", lambda name: None)
    results = suite.run_suite(quick=True)
    assert [r.status for r in results][2] == "skipped"
    out = capsys.readouterr().out
    assert "no test was skipped" not in out
    listing = out.split("skipped, with the reasons pytest and go test give:\n", 1)[1].splitlines()
    assert listing[0].startswith("  Kubernetes conformance (Go): the whole leg skipped: Go is not installed")


def test_a_run_without_skips_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(suite, "ruff_leg", lambda: ("pass", "", []))
    monkeypatch.setattr(suite, "tools_leg", lambda host_setup: ("pass", "", []))
    monkeypatch.setattr(suite, "plugin_leg", lambda combination: lambda: ("pass", "", []))
    monkeypatch.setattr(suite, "updater_leg", lambda combination: lambda: ("pass", "", []))
    monkeypatch.setattr(suite, "go_leg", lambda combination: lambda: ("pass", "", []))
    suite.run_suite(quick=True)
    assert "\nno test was skipped\n" in capsys.readouterr().out


def test_each_pytest_leg_asks_pytest_for_its_skip_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_run(argv: list[str], **_: object) -> subprocess.CompletedProcess:
        seen.append(argv)
        report = next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--junitxml="))
        Path(report).write_text('<testsuites><testsuite><testcase classname="tests.tools.test_x" name="t">'
                                '<skipped message="why">tests/tools/test_x.py:3: why</skipped></testcase>'
                                "</testsuite></testsuites>")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(suite.subprocess, "run", fake_run)
    status, detail, skips = suite.run_pytest(sys.executable, ["tests/tools"])
    assert (status, skips) == ("pass", [suite.Skip("tests/tools/test_x.py", "why")])
    assert "-rs" in seen[0], "pytest's own short summary of skips in the leg's output"
    assert not Path(next(a for a in seen[0] if a.startswith("--junitxml=")).split("=", 1)[1]).exists(), \
        "the report is a temporary file"
