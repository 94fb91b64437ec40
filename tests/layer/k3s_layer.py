"""Reading the k3s parts of the layer for the tests: recipe knobs per machine, the config
renderer the recipe runs, the kernel requirements list."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import yaml
from bbfile import BbFile, parse
from layer_paths import LAYER
from nvidia_layer import nvidia_default

K3S_DIR = LAYER / "recipes-containers/k3s"
CONFIG_DIR = LAYER / "recipes-containers/gpu-k8s-k3s-config"
CONFIG_RECIPE = CONFIG_DIR / "gpu-k8s-k3s-config_1.0.bb"
RENDERER = CONFIG_DIR / "files/gpu-k8s-k3s-config.py"
REQUIREMENTS = K3S_DIR / "k3s-kernel-requirements.yaml"

# Machine overrides, least to most specific, as bitbake applies them (MACHINEOVERRIDES).
MACHINES = {
    "jetson-nano-devkit": ("tegra", "tegra210"),
    "jetson-orin-nano-devkit-nvme": ("tegra", "tegra234"),
    "jetson-agx-thor-devkit": ("tegra", "tegra264"),
    "genericx86-64": ("x86-64",),
    "qemux86-64": ("x86-64", "qemuall"),
}


def k3s_recipe() -> Path:
    found = sorted(K3S_DIR.glob("k3s_*.bb"))
    assert len(found) == 1, f"expected one k3s recipe, found {found}"
    return found[0]


# Knobs recipes read from a class, with their value per machine.
CLASS_KNOBS = {"GPU_K8S_NVIDIA": nvidia_default}


def resolve(bb: BbFile, var: str, overrides: tuple[str, ...]) -> str:
    """The value of var for a machine: its most specific override, else the plain value;
    ${OTHER} references to variables of the same file (or to CLASS_KNOBS) are expanded."""
    if var in CLASS_KNOBS and not bb.values(var):
        return CLASS_KNOBS[var](overrides)
    value = None
    for override in ("", *overrides):
        found = bb.values(var, override) if override else bb.values(var)
        if found:
            value = found[-1].value
    assert value is not None, f"{bb.path.name}: {var} is not set"
    while "${" in value:
        start = value.index("${")
        end = value.index("}", start)
        name = value[start + 2:end]
        value = value[:start] + resolve(bb, name, overrides) + value[end + 1:]
    return " ".join(value.replace("\\\n", " ").split())


def with_classes(recipe: BbFile, *classes: str) -> BbFile:
    """The recipe as bitbake sees it after `inherit`: the classes' assignments first."""
    merged = BbFile(recipe.path)
    for name in classes:
        assert name in recipe.inherits, f"{recipe.path.name} does not inherit {name}"
        merged.assignments += parse(LAYER / "classes" / f"{name}.bbclass").assignments
    merged.assignments += recipe.assignments
    return merged


def config_knobs(machine: str, **changes: str) -> dict[str, str]:
    """The recipe's knobs for a machine (defaults as in the recipe, the platform and role classes)."""
    overrides = MACHINES[machine]
    recipe = with_classes(parse(CONFIG_RECIPE), "gpu_k8s_platform")
    role_class = parse(LAYER / "classes/gpu_k8s_role.bbclass")
    knobs = {
        "role": resolve(role_class, "GPU_K8S_K3S_ROLE", overrides),
        "runtime": resolve(recipe, "GPU_K8S_K3S_RUNTIME", overrides),
        "cgroup-driver": resolve(recipe, "GPU_K8S_CGROUP_DRIVER", overrides),
        "cgroup-v1": resolve(recipe, "GPU_K8S_CGROUP_V1", overrides),
        "nvidia-runtime": resolve(recipe, "GPU_K8S_NVIDIA_RUNTIME", overrides),
        "kubelet-profile": resolve(recipe, "GPU_K8S_KUBELET_PROFILE", overrides),
        "disable": resolve(recipe, "GPU_K8S_K3S_DISABLE", overrides),
        "disable-network-policy": resolve(recipe, "GPU_K8S_K3S_DISABLE_NETWORK_POLICY", overrides),
        "pause-image": resolve(recipe, "GPU_K8S_K3S_PAUSE_IMAGE", overrides),
        "node-labels": resolve(recipe, "GPU_K8S_NODE_LABELS", overrides),
        # GPU_K8S_UPDATE_DEVICE_TYPE: Mender's device type, which defaults to MACHINE
        "device-type": machine,
    }
    knobs.update(changes)
    return knobs


def run_renderer(output_dir: Path, knobs: dict[str, str]) -> subprocess.CompletedProcess:
    """The renderer as do_install runs it: a separate Python process with every knob."""
    argv = [sys.executable, str(RENDERER), "--output-dir", str(output_dir)]
    for name, value in knobs.items():
        argv += [f"--{name}", value]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def render_for(machine: str, output_dir: Path, **changes: str) -> dict[str, dict]:
    """name -> parsed YAML of every drop-in an image for this machine installs."""
    result = run_renderer(output_dir, config_knobs(machine, **changes))
    assert result.returncode == 0, result.stderr
    return {p.name: yaml.safe_load(p.read_text()) or {} for p in sorted(output_dir.glob("*.yaml"))}


def renderer_module():
    spec = importlib.util.spec_from_file_location("gpu_k8s_k3s_config", RENDERER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def kubelet_args(files: dict[str, dict]) -> dict[str, str]:
    """Every kubelet-arg(+) entry of the drop-ins, in k3s's order, as flag -> value."""
    args: dict[str, str] = {}
    for conf in files.values():
        for key in ("kubelet-arg", "kubelet-arg+"):
            for entry in conf.get(key, []):
                flag, _, value = entry.partition("=")
                args[flag] = value
    return args


def requirements() -> dict:
    return yaml.safe_load(REQUIREMENTS.read_text())


def kernel_fragment(path: Path) -> dict[str, str]:
    options: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped.startswith("CONFIG_"):
            continue
        name, _, value = stripped.partition("=")
        assert name[7:] not in options, f"{path.name}:{number}: {name} set twice"
        options[name[7:]] = value
    return options
