"""`lint`: ruff over the repository, oelint-adv over the layer, kas files against kas's schema."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tools import console
from tools.paths import REPO_ROOT

LAYER_DIR = "meta-gpu-k8s"
KAS_DIR = "kas"
# oelint-adv runs once per Yocto series the layer declares (LAYERSERIES_COMPAT in layer.conf).
# From scarthgap on it asks for inherit_defer where an inherit names a variable; kirkstone's
# bitbake 2.0 has no inherit_defer, and our inherits only read DISTRO_FEATURES, which is final
# at configuration time, so the immediate inherit is right on every series.
OELINT_SERIES_SUPPRESS = {
    "scarthgap": ("oelint.var.inherit.inherit_defer",),
    "wrynose": ("oelint.var.inherit.inherit_defer",),
}
OELINT_SUFFIXES = (".bb", ".bbappend", ".bbclass", ".conf", ".inc")


@dataclass
class LintResult:
    name: str
    status: str  # "pass", "FAIL", "skipped"
    detail: str = ""


def venv_tool(name: str) -> str:
    """A tool installed beside the running python (the tooling venv), else from PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def run_ruff(root: Path = REPO_ROOT) -> LintResult:
    console.step("ruff check .")
    code = subprocess.run([venv_tool("ruff"), "check", "."], cwd=root, check=False).returncode
    return LintResult("ruff", "pass" if code == 0 else "FAIL", "" if code == 0 else f"exit {code}")


def layer_files(layer: Path) -> list[Path]:
    return sorted(path for path in layer.rglob("*") if path.is_file() and path.suffix in OELINT_SUFFIXES)


def layer_series(layer: Path) -> list[str]:
    """The series the layer declares in LAYERSERIES_COMPAT_<collection>, in its order."""
    conf = layer / "conf" / "layer.conf"
    found = re.search(r'^LAYERSERIES_COMPAT_\S+\s*=\s*"([^"]*)"', conf.read_text(), re.M) if conf.exists() else None
    return found.group(1).split() if found else []


def oelint_argv(release: str, files: list[str]) -> list[str]:
    suppress = [arg for rule in OELINT_SERIES_SUPPRESS.get(release, ()) for arg in ("--suppress", rule)]
    return [venv_tool("oelint-adv"), "--release", release, "--quiet", *suppress, *files]


def run_oelint(root: Path = REPO_ROOT) -> list[LintResult]:
    layer = root / LAYER_DIR
    if not layer.is_dir():
        return [LintResult("oelint-adv", "skipped", f"{LAYER_DIR}/ does not exist yet")]
    files = layer_files(layer)
    if not files:
        return [LintResult("oelint-adv", "skipped", f"no recipes or confs in {LAYER_DIR}/ yet")]
    series = layer_series(layer)
    if not series:
        return [LintResult("oelint-adv", "FAIL", f"{LAYER_DIR}/conf/layer.conf declares no LAYERSERIES_COMPAT")]
    results = []
    for release in series:
        console.step(f"oelint-adv --release {release} over {len(files)} file(s) in {LAYER_DIR}/")
        # Run from the repo root so oelint-adv picks up ./.oelint.cfg (its release is overridden).
        argv = oelint_argv(release, [str(f.relative_to(root)) for f in files])
        code = subprocess.run(argv, cwd=root, check=False).returncode
        results.append(LintResult(f"oelint-adv {release}", "pass" if code == 0 else "FAIL", f"{len(files)} file(s)"))
    return results


def kas_schema_errors(path: Path) -> list[str]:
    """Schema errors in one kas file, as kas itself would report them (no network)."""
    import jsonschema
    from kas.configschema import CONFIGSCHEMA

    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as bad:
        return [f"not valid YAML: {bad}"]
    validator_class = jsonschema.validators.validator_for(CONFIGSCHEMA)
    validator = validator_class(CONFIGSCHEMA)
    errors = []
    for error in sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        errors.append(f"{where}: {error.message}")
    return errors


def run_kas_schema(root: Path = REPO_ROOT) -> LintResult:
    kas_dir = root / KAS_DIR
    files = sorted(kas_dir.glob("**/*.yml")) if kas_dir.is_dir() else []
    if not files:
        return LintResult("kas schema", "skipped", f"no {KAS_DIR}/*.yml yet")
    console.step(f"kas schema over {len(files)} file(s) in {KAS_DIR}/")
    failures = 0
    for path in files:
        errors = kas_schema_errors(path)
        failures += bool(errors)
        for error in errors:
            console.info(f"{path.relative_to(root)}: {error}")
    if failures:
        return LintResult("kas schema", "FAIL", f"{failures} of {len(files)} file(s) invalid")
    return LintResult("kas schema", "pass", f"{len(files)} file(s)")


def run_lint(root: Path = REPO_ROOT) -> list[LintResult]:
    results = [run_ruff(root), *run_oelint(root), run_kas_schema(root)]
    rows = [[r.name, r.status, r.detail] for r in results]
    console.summary("lint summary", ["check", "result", "detail"], rows)
    for result in results:
        if result.status == "skipped":
            console.info(f"note: {result.name} skipped: {result.detail}")
    return results
