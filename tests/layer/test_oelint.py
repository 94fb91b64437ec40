"""oelint-adv (each series' rules, the repository's .oelint.cfg) finds nothing in our recipes."""

import os
import subprocess
import sys

import pytest
from layer_paths import LAYER, REPO

pytest.importorskip("oelint_adv", reason="oelint-adv is in the tooling venv")

RECIPES = sorted(
    str(p.relative_to(REPO))
    for pattern in ("*.bb", "*.bbappend", "*.bbclass", "*.inc", "*.conf")
    for p in LAYER.rglob(pattern)
)


def run_oelint(*args: str) -> subprocess.CompletedProcess:
    # cwd = repository root, so oelint-adv picks up .oelint.cfg (release, suppressions, constants)
    env = {k: v for k, v in os.environ.items() if k != "OELINT_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "oelint_adv", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_there_are_recipes_to_lint():
    assert any(r.endswith(".bb") for r in RECIPES)
    assert any(r.endswith(".bbappend") for r in RECIPES)


# What ./task lint adds per series (tools/dev/lint.py OELINT_SERIES_SUPPRESS): inherit_defer is
# scarthgap+ only, so a layer that also serves kirkstone cannot use it.
NEWER_SERIES_SUPPRESS = ("--suppress", "oelint.var.inherit.inherit_defer")


@pytest.mark.parametrize("release", ["kirkstone", "scarthgap", "wrynose"])
def test_oelint_reports_nothing_on_the_layer(release):
    extra = NEWER_SERIES_SUPPRESS if release != "kirkstone" else ()
    result = run_oelint("--release", release, *extra, *RECIPES)
    findings = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and not findings, f"oelint-adv findings:\n{findings}"


def test_every_suppression_in_a_recipe_gives_a_reason():
    for rel in RECIPES:
        for n, line in enumerate((REPO / rel).read_text().splitlines(), 1):
            if "nooelint:" in line:
                reason = line.split(" - ", 1)[1].strip() if " - " in line else ""
                assert reason, f"{rel}:{n}: a nooelint suppression needs ' - <reason>'"


def test_jetson_overrides_are_known_to_oelint_through_the_constants_file(tmp_path):
    # Control: outside the repository (no .oelint.cfg) oelint-adv rejects the :tegra overrides.
    image = str(LAYER / "recipes-core/images/gpu-k8s-image.bb")
    bare = subprocess.run(
        [sys.executable, "-m", "oelint_adv", "--release", "kirkstone", "--quiet", image],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "oelint.vars.specific" in bare.stdout + bare.stderr, "control run should flag :tegra"
    assert run_oelint(image).returncode == 0, "with .oelint.cfg the :tegra overrides are accepted"
