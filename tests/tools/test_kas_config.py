"""build --dry-run loads the kas configuration with kas's own include handler and schema, offline:
a missing or unparsable include, or one kas's schema rejects, fails the dry run (exit 1) and stops a
real build before the host check, naming the file, who includes it and kas's reason."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tools.image import build, kas_config
from tools.paths import REPO_ROOT


@pytest.fixture
def kas_copy(tmp_path: Path) -> Path:
    """A repository root with a copy of our kas files, to break one at a time."""
    shutil.copytree(REPO_ROOT / "kas", tmp_path / "kas")
    return tmp_path


def load(root: Path, *names: str) -> list[str]:
    return kas_config.config_errors([root / name for name in names], root)


def test_every_kas_argument_build_passes_loads_clean_with_kas_itself() -> None:
    for machine in build.MACHINES:
        for role in build.ROLES:
            for licence in (False, True):
                argument = build.kas_file_for(machine, role, licence)
                assert kas_config.config_errors([REPO_ROOT / part for part in argument.split(":")]) == [], argument


def test_a_missing_include_is_named_with_the_file_that_includes_it(kas_copy: Path) -> None:
    top = kas_copy / "kas" / "jetson-orin-nano.yml"
    top.write_text(top.read_text().replace("kas/include/wrynose.yml", "kas/include/wrynose-lts.yml"))
    assert load(kas_copy, "kas/jetson-orin-nano.yml") == [
        "kas/include/wrynose-lts.yml does not exist (included by kas/jetson-orin-nano.yml)"]


def test_an_unparsable_include_is_named(kas_copy: Path) -> None:
    (kas_copy / "kas/include/wrynose.yml").write_text("header:\n  version: 14\n repos: [\n")
    (error,) = load(kas_copy, "kas/jetson-orin-nano.yml")
    assert error.startswith("kas/include/wrynose.yml: Configuration file is not valid YAML: Error in line ")


def test_an_include_kas_s_schema_rejects_is_named_with_the_schema_s_words(kas_copy: Path) -> None:
    (kas_copy / "kas/include/machine-jetson-agx-orin-devkit.yml").write_text("header:\n  version: 14\nmachin: x\n")
    assert load(kas_copy, "kas/jetson-orin-nano.yml", "kas/include/machine-jetson-agx-orin-devkit.yml") == [
        "kas/include/machine-jetson-agx-orin-devkit.yml does not follow kas's schema: (top level): Additional "
        "properties are not allowed ('machin' was unexpected)"]


def test_a_lock_file_that_does_not_load_is_named_too(kas_copy: Path) -> None:
    (kas_copy / "kas/jetson-orin-nano.lock.yml").write_text("overrides: {}\n")  # no header
    (error,) = load(kas_copy, "kas/jetson-orin-nano.yml")
    assert error.startswith("kas/jetson-orin-nano.lock.yml does not follow kas's schema: ")


@pytest.fixture
def broken_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """--machine qemu built from a kas file whose include has a typo."""
    top = tmp_path / "qemu-x86-64.yml"
    top.write_text((REPO_ROOT / "kas/qemu-x86-64.yml").read_text().replace(
        "kas/include/mender-qemu.yml", "kas/include/mender-qemo.yml"))
    assert "mender-qemo.yml" in top.read_text()
    monkeypatch.setitem(build.MACHINES, "qemu", replace(build.MACHINES["qemu"], kas_file=str(top)))
    return top


def test_a_broken_include_stops_a_build_before_the_host_is_checked(tmp_path: Path, broken_machine: Path,
                                                                    stand_ins, monkeypatch) -> None:
    stand_ins.add("kas")
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    monkeypatch.setattr(build, "refuse_unfit_host", lambda o, e: pytest.fail("the host was checked first"))
    with pytest.raises(build.BuildError, match=r"^kas cannot load .*qemu-x86-64.yml: kas/include/mender-qemo.yml "
                       r"does not exist \(included by .*qemu-x86-64.yml\); fix the kas file \(./task lint"):
        build.run_build(build.BuildOptions(build_dir=tmp_path / "qemu"), environ={})
    assert stand_ins.calls("kas") == []


def test_build_dry_run_fails_on_a_broken_include_after_showing_the_command(tmp_path: Path, broken_machine: Path,
                                                                           stand_ins, monkeypatch, capsys) -> None:
    stand_ins.add("kas")
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    monkeypatch.setattr(build, "refuse_unfit_host", lambda o, e: [])
    with pytest.raises(build.BuildError, match=r"^dry run: a real build would stop at the 1 problem\(s\) above"):
        build.run_build(build.BuildOptions(build_dir=tmp_path / "qemu", dry_run=True), environ={})
    out = capsys.readouterr().out
    assert "warning: kas cannot load " in out and "kas/include/mender-qemo.yml does not exist" in out
    assert f"would run: cd {REPO_ROOT} && " in out and "kas build --target gpu-k8s-image-dev" in out
    assert stand_ins.calls("kas") == []
