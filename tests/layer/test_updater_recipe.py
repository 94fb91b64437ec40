"""The gpu-k8s-update recipe: built from updater/ of this repository, its unit enabled, and a
runtime closure that covers every standard-library module the agent imports."""

from __future__ import annotations

import ast
import configparser
import hashlib
import re
import sys

from bbfile import parse
from layer_paths import LAYER, REPO

RECIPE_DIR = LAYER / "recipes-fleet/gpu-k8s-update"
UPDATER = REPO / "updater"

# Which oe-core python3 package ships each module (meta/recipes-devtools/python/python3/
# python3-manifest.json at our pinned openembedded-core). A new import must be added here,
# which makes whoever adds it check the recipe's RDEPENDS.
STDLIB_PACKAGE = {
    "__future__": "python3-core", "argparse": "python3-core", "collections": "python3-core",
    "dataclasses": "python3-profile", "enum": "python3-core", "http": "python3-netclient",
    "json": "python3-json", "logging": "python3-logging", "os": "python3-core", "pathlib": "python3-core",
    "re": "python3-core",
    "shlex": "python3-shell", "shutil": "python3-core", "signal": "python3-core", "socket": "python3-io",
    "subprocess": "python3-core", "sys": "python3-core", "time": "python3-core", "typing": "python3-core",
    "urllib": "python3-core", "ssl": "python3-io", "base64": "python3-netclient", "tempfile": "python3-io",
}


def recipe():
    found = sorted(RECIPE_DIR.glob("gpu-k8s-update_*.bb"))
    assert len(found) == 1, f"expected one gpu-k8s-update recipe, found {found}"
    return found[0]


def agent_imports() -> set[str]:
    modules = set()
    for source in (UPDATER / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m != "gpu_k8s_update"}


def test_recipe_builds_updater_dir_of_this_repository():
    path = recipe()
    bb = parse(path)
    assert bb.words("SRC_URI") == ["file://updater"]
    extra = bb.value("FILESEXTRAPATHS", "prepend").rstrip(":")
    resolved = (path.parent / extra.replace("${THISDIR}/", "")).resolve()
    assert (resolved / "updater" / "setup.cfg").exists(), f"FILESEXTRAPATHS {extra} does not reach updater/"
    assert bb.value("S") == "${UNPACKDIR}/updater"
    assert {"python_setuptools_build_meta", "systemd"} <= set(bb.inherits)


def test_recipe_version_and_license_match_the_project():
    path = recipe()
    setup = configparser.ConfigParser()
    setup.read(UPDATER / "setup.cfg")
    assert path.stem.split("_", 1)[1] == setup["metadata"]["version"]
    bb = parse(path)
    md5 = re.search(r"file://LICENSE;md5=([0-9a-f]{32})", bb.value("LIC_FILES_CHKSUM")).group(1)
    assert md5 == hashlib.md5((UPDATER / "LICENSE").read_bytes()).hexdigest()
    assert bb.value("LICENSE") == setup["metadata"]["license"]


def test_agent_uses_the_standard_library_only_and_the_recipe_ships_every_part_of_it():
    imports = agent_imports()
    not_stdlib = sorted(m for m in imports if m not in sys.stdlib_module_names)
    assert not not_stdlib, f"the agent must stay standard-library only, imports {not_stdlib}"
    unmapped = sorted(imports - set(STDLIB_PACKAGE))
    assert not unmapped, f"map {unmapped} to their oe-core python3 package here, and check RDEPENDS"
    rdepends = set(parse(recipe()).words("RDEPENDS", "${PN}"))
    missing = sorted({STDLIB_PACKAGE[m] for m in imports} - rdepends)
    assert not missing, f"RDEPENDS lacks {missing}"
    assert "mender-update" not in rdepends, "without meta-mender nothing provides it: only with the A/B opt-in"
    mender = parse(recipe()).words("RDEPENDS", "${PN}", "append", "gpu-k8s-mender")
    assert mender == ["mender-update", "${GPU_K8S_UPDATE_AB_RDEPENDS}"], (
        "the agent drives mender-update (which brings fw_printenv/grubenv), and on Tegra its module")


class _Datastore:
    """bitbake's d, as far as the recipe's inline Python reads it."""

    def __init__(self, **values: str) -> None:
        self.values = values

    def getVar(self, name: str) -> str | None:  # bitbake's name
        return self.values.get(name)


def _recipe_backend_function():
    """The recipe's gpu_k8s_update_ab_backend(d), compiled as bitbake would run it."""
    text = recipe().read_text()
    source = re.search(r"^def gpu_k8s_update_ab_backend\(d\):\n(?:    .*\n|\n)+", text, re.M)
    assert source, "the recipe derives the A/B backend in gpu_k8s_update_ab_backend(d)"
    scope: dict[str, object] = {}
    exec(compile(source.group(0), str(recipe()), "exec"), scope)  # our own recipe's function
    return scope["gpu_k8s_update_ab_backend"]


def test_the_image_names_the_backend_of_the_mender_integration_it_was_built_with():
    backend = _recipe_backend_function()
    assert backend(_Datastore(TEGRA_MENDER_SCHEME="native", MENDER_FEATURES="mender-uboot")) == "mender-tegra"
    assert backend(_Datastore(MENDER_FEATURES="mender-image mender-grub mender-image-uefi")) == "mender-grub"
    assert backend(_Datastore(MENDER_FEATURES="mender-image mender-uboot mender-image-sd")) == "mender-uboot"
    assert backend(_Datastore(TEGRA_MENDER_SCHEME="classic", MENDER_FEATURES="mender-image")) == ""
    bb = parse(recipe())
    install = bb.tasks["do_install:append:gpu-k8s-mender"]
    assert "artifact_name=%s\\nab_backend=%s" in install and "${MENDER_ARTIFACT_NAME}" in install
    assert "${D}${datadir}/gpu-k8s-update/image-info" in install and "bbfatal" in install
    assert bb.value("PACKAGE_ARCH") == "${MACHINE_ARCH}", "image-info differs per machine"
    tegra_only = bb.value("GPU_K8S_UPDATE_AB_RDEPENDS")
    assert "tegra-rootfs-update-module" in tegra_only and "== 'mender-tegra'" in tegra_only


def test_gate_unit_is_installed_enabled_and_runs_the_console_script():
    bb = parse(recipe())
    assert bb.value("SYSTEMD_SERVICE", "${PN}").split() == ["gpu-k8s-update-gate.service",
                                                            "gpu-k8s-update-report.service"]
    assert bb.values("SYSTEMD_AUTO_ENABLE", "${PN}")[-1].value == "enable"
    install = bb.tasks["do_install:append"]
    assert "${S}/systemd/gpu-k8s-update-gate.service" in install and "${systemd_system_unitdir}" in install
    assert "${S}/systemd/gpu-k8s-update-report.service" in install
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(UPDATER / "systemd/gpu-k8s-update-gate.service")
    setup = configparser.ConfigParser()
    setup.read(UPDATER / "setup.cfg")
    script = setup["options.entry_points"]["console_scripts"].split("=")[0].strip()
    assert unit["Service"]["ExecStart"].split()[:2] == [f"/usr/bin/{script}", "gate"]
    assert unit["Unit"]["ConditionPathExists"] == "/data/gpu-k8s-update/marker.json", (
        "the gate runs only while our marker exists on the data partition"
    )
    assert unit["Service"]["FailureAction"] == "reboot", "a crashed gate must not leave an unproven update"


def test_report_unit_publishes_the_data_check_each_time_k3s_starts_and_never_acts_on_failure():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(UPDATER / "systemd/gpu-k8s-update-report.service")
    assert unit["Service"]["ExecStart"].split() == ["/usr/bin/gpu-k8s-update", "report"]
    assert set(unit["Install"]["WantedBy"].split()) == {"k3s.service", "k3s-agent.service"}
    assert {"k3s.service", "k3s-agent.service", "gpu-k8s-data.service"} <= set(unit["Unit"]["After"].split())
    assert unit["Service"]["Type"] == "exec", "the boot never waits for the API server"
    assert "FailureAction" not in unit["Service"], "publishing decides nothing"
