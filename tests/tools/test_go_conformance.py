"""The conformance leg: its pin, its verdicts from go test's events, and its skip where Go is not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tools.dev import go_conformance

REPO = Path(__file__).resolve().parents[2]
GO_MOD = (REPO / "conformance" / "go.mod").read_text()


def test_the_harness_pins_the_kubernetes_of_the_k3s_we_ship() -> None:
    """Proves conformance/go.mod's k8s.io/kubernetes is the k3s recipe's version and every staging
    module is replaced by its release of the same line (v1.N.P -> v0.N.P)."""
    inc = (REPO / "meta-gpu-k8s" / "recipes-containers" / "k3s" / "k3s-line-1.36.inc").read_text()
    k3s = re.search(r'^K3S_VERSION = "([0-9.]+)"', inc, re.M).group(1)
    _, kubernetes = go_conformance.go_mod_versions(GO_MOD)
    assert kubernetes == f"v{k3s}"
    staging = re.findall(r"^\s*(k8s\.io/\S+) => k8s\.io/\S+ (\S+)$", GO_MOD, re.M)
    assert len(staging) >= 30, "every staging module of k8s.io/kubernetes needs its replace line"
    assert {version for _, version in staging} == {"v0." + k3s.split(".", 1)[1]}


def test_go_mod_versions_refuses_a_file_without_the_pin() -> None:
    with pytest.raises(ValueError, match="k8s.io/kubernetes"):
        go_conformance.go_mod_versions("module x\n\ngo 1.26.0\n")


@pytest.mark.parametrize(("text", "version"), [("go1.26.8\n", (1, 26, 8)), ("go1.27rc1", (1, 27)),
                                               ("devel go1.27-abc", None), ("", None)])
def test_go_versions_are_read_from_go_env(text: str, version: tuple[int, ...] | None) -> None:
    assert go_conformance.parse_go_version(text) == version


def test_the_go_environment_keeps_caches_under_build_and_the_module_cache_deletable(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    monkeypatch.setenv("GOFLAGS", "-buildvcs=false -modcacherw")
    env = go_conformance.go_env(tmp_path)
    assert env["GOMODCACHE"] == str(tmp_path / "mod") and env["GOCACHE"] == str(tmp_path / "cache")
    assert env["GOFLAGS"].split() == ["-buildvcs=false", "-modcacherw"]
    assert env["GOTOOLCHAIN"] == "local"
    monkeypatch.delenv("GOFLAGS")
    assert go_conformance.go_env(tmp_path)["GOFLAGS"] == "-modcacherw"


def events(*items: dict) -> list[str]:
    return [json.dumps(item) + "\n" for item in items]


def test_a_failing_test_fails_the_leg_and_its_output_is_shown() -> None:
    shown: list[str] = []
    result = go_conformance.tally(events(
        {"Action": "run", "Package": "m/deviceplugin", "Test": "TestA"},
        {"Action": "output", "Package": "m/deviceplugin", "Test": "TestA", "Output": "checks.go:1: allocatable 0\n"},
        {"Action": "fail", "Package": "m/deviceplugin", "Test": "TestA", "Elapsed": 1.5},
        {"Action": "pass", "Package": "m/deviceplugin", "Test": "TestB", "Elapsed": 0.1},
        {"Action": "skip", "Package": "m/deviceplugin", "Test": "TestC"},
        {"Action": "fail", "Package": "m/deviceplugin", "Elapsed": 2},
    ), shown.append)
    assert result.verdict() == ("FAIL", "1 passed, 1 failed, 1 skipped")
    assert any("FAIL deviceplugin.TestA" in line and "allocatable 0" in line for line in shown)


def test_a_package_that_fails_without_a_failing_test_fails_the_leg() -> None:
    """Proves a build error or a panic outside a test (no test fails, the package does) is a FAIL."""
    result = go_conformance.tally(events(
        {"Action": "pass", "Package": "m/kubelet", "Test": "TestA"},
        {"Action": "build-output", "ImportPath": "m/dra", "Output": "dra.go:1: undefined: x\n"},
        {"Action": "fail", "Package": "m/dra", "Elapsed": 0},
    ), lambda _: None)
    status, detail = result.verdict()
    assert status == "FAIL" and "m/dra" in detail


def test_no_test_run_is_not_a_pass_and_go_lines_that_are_not_json_are_shown() -> None:
    shown: list[str] = []
    result = go_conformance.tally(["go: downloading k8s.io/kubernetes v1.36.4\n"], shown.append)
    assert result.verdict()[0] == "NO TESTS"
    assert shown == ["go: downloading k8s.io/kubernetes v1.36.4"]


def test_without_go_the_leg_is_skipped_and_says_what_would_run_it(monkeypatch) -> None:
    monkeypatch.setattr(go_conformance.shutil, "which", lambda name: None)
    status, detail = go_conformance.leg(lambda: pytest.fail("no interpreter is needed to skip"))
    assert status == "skipped"
    assert "Go is not installed" in detail and "fix: install Go >= 1.26" in detail


def test_an_older_go_skips_the_leg_naming_both_versions(monkeypatch, tmp_path: Path) -> None:
    fake_go = tmp_path / "go"
    fake_go.write_text("#!/bin/sh\necho go1.22.2\n")
    fake_go.chmod(0o755)
    monkeypatch.setattr(go_conformance.shutil, "which", lambda name: str(fake_go))
    status, detail = go_conformance.leg(lambda: pytest.fail("no interpreter is needed to skip"))
    assert status == "skipped"
    assert "go1.22.2 is older than the go 1.26" in detail
