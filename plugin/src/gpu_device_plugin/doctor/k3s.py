"""Check 7: how k3s runs pods (docker or its containerd, which default runtime), from its config and units."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..config.settings import Settings
from .host import host_path, read_text, truthy
from .report import FAIL, PASS, SKIP, WARN, Check

K3S_CONFIG = "/etc/rancher/k3s/config.yaml"
K3S_CONFIG_DROPINS = "/etc/rancher/k3s/config.yaml.d"
K3S_CONTAINERD_CONFIG = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
K3S_CONTAINERD_TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
K3S_UNITS = tuple(
    f"{base}/{unit}"
    for base in ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")
    for unit in ("k3s.service", "k3s-agent.service")
)


@dataclass(frozen=True)
class K3sConfig:
    files: tuple[str, ...] = ()  # config files and units that were read (node paths)
    docker: bool = False
    docker_from: str = ""  # which file made the decision
    default_runtime: str = ""
    default_runtime_from: str = ""
    errors: tuple[str, ...] = ()  # files that do not parse


_EXEC_START = re.compile(r"^\s*ExecStart\s*=(.*)$", re.MULTILINE)
_DOCKER_FLAG = re.compile(r"(?:^|\s)--docker(?:=(\S+))?(?=\s|$)")
_RUNTIME_FLAG = re.compile(r"(?:^|\s)--default-runtime(?:=|\s+)(\S+)")


def parse_k3s_config(configs: Sequence[tuple[str, str]], units: Sequence[tuple[str, str]] = ()) -> K3sConfig:
    """Merge (path, text) of config.yaml and its drop-ins (later wins), then the units' flags (flags win)."""
    import yaml  # as in config.parse_file: only loaded when needed

    docker, docker_from, runtime, runtime_from = False, "", "", ""
    errors: list[str] = []
    for path, text in configs:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            errors.append(f"{path} is not valid YAML: {exc}".replace("\n", " "))
            continue
        if doc is None:
            continue
        if not isinstance(doc, dict):
            errors.append(f"{path}: top level must be a mapping, got {type(doc).__name__}")
            continue
        if "docker" in doc:
            docker, docker_from = truthy(doc["docker"]), path
        if "default-runtime" in doc:
            runtime, runtime_from = str(doc["default-runtime"] or "").strip(), path
    for path, text in units:
        for command in _EXEC_START.findall(text.replace("\\\n", " ")):
            flag = _DOCKER_FLAG.search(command)
            if flag:
                docker, docker_from = flag.group(1) is None or truthy(flag.group(1)), path
            value = _RUNTIME_FLAG.search(command)
            if value:
                runtime, runtime_from = value.group(1).strip("'\""), path
    return K3sConfig(tuple(p for p, _ in (*configs, *units)), docker, docker_from, runtime, runtime_from,
                     tuple(errors))


def evaluate_k3s(k3s: K3sConfig, gpu_kind: str | None) -> Check:
    name = "k3s config"
    if not k3s.files:
        return Check(name, SKIP, f"no {K3S_CONFIG} (nor drop-ins or k3s units): k3s is not configured here")
    if k3s.errors:
        return Check(name, FAIL, "; ".join(k3s.errors) + ": k3s does not start with it",
                     "correct the YAML in the file named, then restart k3s")
    if k3s.docker:
        found = f"k3s runs pods through docker (docker: true in {k3s.docker_from}): docker's default runtime decides"
        status = PASS
    elif k3s.default_runtime == "nvidia":
        found = f"k3s default-runtime is nvidia ({k3s.default_runtime_from}): every pod runs with the nvidia runtime"
        status = PASS
    else:
        runtime = (f"default-runtime {k3s.default_runtime} ({k3s.default_runtime_from})" if k3s.default_runtime
                   else "no docker: true and no default-runtime: nvidia")
        found = (f"k3s uses its own containerd ({runtime} in {', '.join(k3s.files)}): only pods with "
                 "runtimeClassName: nvidia get the GPU")
        status = WARN
    if gpu_kind == "simulated":
        return Check(name, SKIP, f"{found}; simulated GPUs need no NVIDIA runtime")
    if status == PASS:
        return Check(name, PASS, found)
    return Check(name, WARN, found,
                 "add runtimeClassName: nvidia to GPU pod specs, or set docker: true (with docker's default-runtime "
                 f"nvidia) or default-runtime: nvidia (k3s >= 1.29) in {K3S_CONFIG} and restart k3s")


def read_k3s_config(settings: Settings) -> K3sConfig:
    configs: list[tuple[str, str]] = []
    main = read_text(host_path(settings, K3S_CONFIG))
    if main is not None:
        configs.append((K3S_CONFIG, main))
    # k3s reads config.yaml.d/*.yaml (and .yml) in name order after config.yaml
    dropin_dir = host_path(settings, K3S_CONFIG_DROPINS)
    for path in sorted(glob.glob(dropin_dir + "/*.yaml") + glob.glob(dropin_dir + "/*.yml")):
        text = read_text(path)
        if text is not None:
            configs.append((f"{K3S_CONFIG_DROPINS}/{os.path.basename(path)}", text))
    units: list[tuple[str, str]] = []
    for unit in K3S_UNITS:
        dropins = sorted(glob.glob(host_path(settings, unit + ".d") + "/*.conf"))
        for path in (unit, *(f"{unit}.d/{os.path.basename(d)}" for d in dropins)):
            text = read_text(host_path(settings, path))
            if text is not None:
                units.append((path, text))
    return parse_k3s_config(configs, units)
