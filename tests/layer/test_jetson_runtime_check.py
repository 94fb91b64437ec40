"""Jetson isolation fails closed: docker and k3s require a unit that reads the NVIDIA runtime's settings back.

meta-tegra's nvidia-container-setup.service writes the toolkit's defaults (every GPU to any container that asks)
into /run at every boot; our drop-in then sets isolation with nvidia-ctk. If that step fails, or anything leaves
the file without the settings, gpu-k8s-nvidia-runtime-check.service fails and docker, k3s and k3s-agent, which
require it, do not start. The recipe's own do_install is run here (its shell, the layer's knobs per machine),
the units it installs are read as systemd reads them, and the check's command line runs against config files
nvidia-ctk 1.19.1 itself wrote (tests/plugin/fixtures/toolkit). The Nano (toolkit 1.0.5) gets none of it."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bbfile import parse
from k3s_layer import CONFIG_RECIPE, MACHINES, resolve
from layer_paths import LAYER

REPO = LAYER.parent
RECIPE_DIR = LAYER / "dynamic-layers/tegra/recipes-containers/gpu-k8s-nvidia-runtime-config"
RECIPE = RECIPE_DIR / "gpu-k8s-nvidia-runtime-config_1.0.bb"
PLATFORM = parse(LAYER / "classes/gpu_k8s_platform.bbclass")
TOOLKIT = REPO / "tests/plugin/fixtures/toolkit"
ORIN_CONFIG = REPO / "tests/plugin/fixtures/jetson-orin-nano-r39/etc/nvidia-container-runtime/config.toml"
SETUP_UNIT = "nvidia-container-setup.service"
CHECK_UNIT = "gpu-k8s-nvidia-runtime-check.service"
UNITDIR = "/usr/lib/systemd/system"


def runtime_settings(isolation: str, mode: str) -> str:
    """GPU_K8S_RUNTIME_SETTINGS as bitbake expands it for these knobs (its two inline expressions)."""
    text = parse(RECIPE).value("GPU_K8S_RUNTIME_SETTINGS").replace("\\\n", " ")
    text = text.replace("${@'true' if d.getVar('GPU_K8S_GPU_ISOLATION') == '0' else 'false'}",
                        "true" if isolation == "0" else "false")
    text = text.replace("${@'--set nvidia-container-runtime.mode=' + d.getVar('GPU_K8S_NVIDIA_RUNTIME_MODE') "
                        "if d.getVar('GPU_K8S_NVIDIA_RUNTIME_MODE') else ''}",
                        f"--set nvidia-container-runtime.mode={mode}" if mode else "")
    assert "${" not in text, f"an expression the test does not know: {text}"
    return " ".join(text.split())


def install(tmp_path: Path, isolation: str = "1", mode: str = "csv") -> Path:
    """Run the recipe's do_install with these knobs; returns ${D}."""
    bb = parse(RECIPE)
    dest = tmp_path / "image"
    values = {"D": str(dest), "UNPACKDIR": str(RECIPE_DIR / "files"), "systemd_system_unitdir": UNITDIR,
              "bindir": "/usr/bin", "GPU_K8S_NVIDIA_SETUP_UNIT": PLATFORM.value("GPU_K8S_NVIDIA_SETUP_UNIT", "tegra"),
              "GPU_K8S_RUNTIME_SETTINGS": runtime_settings(isolation, mode),
              "GPU_K8S_RUNTIME_USERS": bb.value("GPU_K8S_RUNTIME_USERS")}
    script = re.sub(r"\$\{([A-Za-z0-9_]+)\}", lambda m: values[m.group(1)], bb.tasks["do_install"])
    done = subprocess.run(["bash", "-euc", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return dest


def unit(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def run_check(dest: Path, root: Path) -> subprocess.CompletedProcess:
    """The check unit's ExecStart, with the plugin run from the source tree and the host's / at `root`."""
    command = shlex.split(unit(dest / UNITDIR.lstrip("/") / CHECK_UNIT)["Service"]["ExecStart"])
    assert command[:2] == ["/usr/bin/gpu-device-plugin", "runtime-config"]
    return subprocess.run([sys.executable, "-m", "gpu_device_plugin", *command[1:], "--root", str(root)],
                          env={**os.environ, "PYTHONPATH": str(REPO / "plugin/src")},
                          capture_output=True, text=True, timeout=60, check=False)


def node(tmp_path: Path, config: Path | None, link: bool = True) -> Path:
    """A Jetson's /: /etc's config.toml links to /run, as meta-tegra installs it; `config` is what the setup
    unit left in /run (None: nothing)."""
    root = tmp_path / "node"
    (root / "etc/nvidia-container-runtime").mkdir(parents=True)
    (root / "run/nvidia-container-runtime").mkdir(parents=True)
    if config is not None:
        shutil.copy(config, root / "run/nvidia-container-runtime/config.toml")
    if link:
        os.symlink("../../run/nvidia-container-runtime/config.toml", root / "etc/nvidia-container-runtime/config.toml")
    return root


# ---- the units --------------------------------------------------------------------------------


def test_docker_and_k3s_require_the_check_and_the_check_requires_the_setup_unit(tmp_path: Path) -> None:
    dest = install(tmp_path)
    units = dest / UNITDIR.lstrip("/")
    check = unit(units / CHECK_UNIT)
    assert (check["Unit"]["Requires"], check["Unit"]["After"]) == (SETUP_UNIT, SETUP_UNIT)
    assert set(check["Unit"]["Before"].split()) >= {"docker.service", "k3s.service", "k3s-agent.service"}
    assert (check["Service"]["Type"], check["Service"]["RemainAfterExit"]) == ("oneshot", "yes")
    for user in ("docker.service", "k3s.service", "k3s-agent.service"):
        [dropin] = (units / f"{user}.d").iterdir()
        conf = unit(dropin)
        # Requires and After together: a failed check fails their start ("Dependency failed"); Wants would not
        assert (conf["Unit"]["Requires"], conf["Unit"]["After"]) == (CHECK_UNIT, CHECK_UNIT), user
    setup = unit(units / f"{SETUP_UNIT}.d/50-gpu-k8s-runtime.conf")["Service"]["ExecStartPost"]
    assert not setup.startswith("-"), "a failed nvidia-ctk must fail the setup unit"


@pytest.mark.parametrize(("isolation", "mode"), [("1", "csv"), ("0", "csv"), ("1", "")])
def test_the_check_reads_back_exactly_the_settings_the_drop_in_sets(tmp_path: Path, isolation: str, mode: str) -> None:
    dest = install(tmp_path, isolation, mode)
    units = dest / UNITDIR.lstrip("/")
    sets = shlex.split(unit(units / f"{SETUP_UNIT}.d/50-gpu-k8s-runtime.conf")["Service"]["ExecStartPost"])
    expects = shlex.split(unit(units / CHECK_UNIT)["Service"]["ExecStart"])
    pairs = [sets[i + 1] for i, word in enumerate(sets) if word == "--set"]
    assert pairs and pairs == [expects[i + 1] for i, word in enumerate(expects) if word == "--expect"]
    assert ("accept-nvidia-visible-devices-envvar-when-unprivileged=" + ("true" if isolation == "0" else "false")) \
        in pairs
    assert any(p.startswith("nvidia-container-runtime.mode=") for p in pairs) == bool(mode)


def test_systemd_reads_the_installed_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this host")
    dest = install(tmp_path)
    units = dest / UNITDIR.lstrip("/")
    # the units the drop-ins extend and the targets every service is ordered against, as stand-ins; the
    # programs they name present
    for name in (SETUP_UNIT, "docker.service", "k3s.service", "k3s-agent.service"):
        (units / name).write_text("[Service]\nType=oneshot\nExecStart=/usr/bin/true\n")
    for name in ("sysinit.target", "basic.target", "shutdown.target"):
        (units / name).write_text("[Unit]\nDefaultDependencies=no\n")
    (dest / "usr/bin").mkdir(parents=True)
    for program in ("gpu-device-plugin", "nvidia-ctk", "true"):
        (dest / "usr/bin" / program).write_text("#!/bin/sh\n")
        (dest / "usr/bin" / program).chmod(0o755)
    done = subprocess.run([analyze, "verify", f"--root={dest}", CHECK_UNIT, "docker.service", "k3s.service",
                           "k3s-agent.service", SETUP_UNIT], capture_output=True, text=True, timeout=120, check=False)
    # a Requires= naming a unit that is not there fails; a misspelt key is only warned about
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ignoring" not in done.stdout + done.stderr, done.stdout + done.stderr


# ---- the check against what the setup unit leaves in /run ---------------------------------------


def test_the_check_passes_on_the_config_nvidia_ctk_wrote_with_the_image_settings(tmp_path: Path) -> None:
    done = run_check(install(tmp_path), node(tmp_path, ORIN_CONFIG))
    assert done.returncode == 0, done.stderr
    assert "in force: accept-nvidia-visible-devices-envvar-when-unprivileged=false" in done.stdout


@pytest.mark.parametrize(("config", "link", "words"), [
    # the drop-in's nvidia-ctk failed: the setup unit's own defaults
    (TOOLKIT / "meta-tegra-generated-1.19.1.toml", True,
     "accept-nvidia-visible-devices-envvar-when-unprivileged is true (the default), not false"),
    # the setup unit wrote nothing
    (None, True, "no /etc/nvidia-container-runtime/config.toml"),
    # meta-tegra's link without its target, or no file at all
    (None, False, "no /etc/nvidia-container-runtime/config.toml"),
    # a file the runtime could not load
    (TOOLKIT / "not-toml", True, "does not load"),
])
def test_the_check_fails_when_the_settings_are_not_in_force(tmp_path: Path, config: Path | None, link: bool,
                                                            words: str) -> None:
    if config is not None and config.name == "not-toml":
        config = tmp_path / "not-toml"
        config.write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = maybe\n")
    done = run_check(install(tmp_path), node(tmp_path, config, link))
    assert done.returncode == 1
    assert words in done.stderr
    assert "journalctl -u nvidia-container-setup" in done.stderr


def test_the_opt_out_is_checked_as_set(tmp_path: Path) -> None:
    opted_out = install(tmp_path / "a", isolation="0")
    assert run_check(opted_out, node(tmp_path / "b", TOOLKIT / "meta-tegra-opt-out-1.19.1.toml")).returncode == 0
    # the isolating config is not what an opted-out image asked for, and the reverse
    assert run_check(opted_out, node(tmp_path / "c", ORIN_CONFIG)).returncode == 1
    assert run_check(install(tmp_path / "d"), node(tmp_path / "e", TOOLKIT / "meta-tegra-opt-out-1.19.1.toml")
                     ).returncode == 1


# ---- per machine: the Orin and Thor carry it, the Nano does not ----------------------------------


def test_only_the_orin_and_thor_carry_the_check_and_the_nano_keeps_its_units_untouched() -> None:
    packages = {m: resolve(PLATFORM, "GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE", o) for m, o in MACHINES.items()}
    assert packages == {"jetson-nano-devkit": "", "jetson-orin-nano-devkit-nvme": "gpu-k8s-nvidia-runtime-config",
                        "jetson-agx-thor-devkit": "gpu-k8s-nvidia-runtime-config", "genericx86-64": "",
                        "qemux86-64": ""}
    recipe = parse(RECIPE)
    assert recipe.value("COMPATIBLE_MACHINE", "tegra210") == "(^$)"
    assert recipe.words("RDEPENDS", "${PN}") == ["gpu-device-plugin", "nvidia-container-toolkit"]
    # k3s's own config installs no NVIDIA ordering any more: the check's drop-ins are the only ones
    assert "NVIDIA_SETUP_UNIT" not in parse(CONFIG_RECIPE).tasks["do_install"]
    assert not (CONFIG_RECIPE.parent / "files/30-gpu-k8s-nvidia-setup.conf").exists()
