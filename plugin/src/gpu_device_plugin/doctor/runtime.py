"""Check 8: does the container runtime pods run in (docker or k3s's containerd) have the nvidia runtime, and
does a pod get only the GPUs allocated to it (the nvidia runtime's isolation settings)?"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Sequence

from ..cdi import handover, toolkit_config
from ..config.settings import DEVICE_LIST_AUTO, Settings
from .host import host_path, read_text
from .k3s import K3S_CONTAINERD_CONFIG, K3S_CONTAINERD_TEMPLATE, K3sConfig
from .report import FAIL, PASS, SKIP, WARN, Check

# Paths on the node (read under settings.host_root).
DOCKER_DAEMON_JSON = "/etc/docker/daemon.json"
NVIDIA_RUNTIME = "/usr/bin/nvidia-container-runtime"
# Where docker looks up a runtime path that is not absolute (a typical root PATH).
PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
GPU_BACKENDS = ("tegra", "nvml")  # backends whose pods need the NVIDIA container runtime


def runtime_severity(gpu_kind: str | None) -> str:
    # Without the nvidia runtime a real GPU is invisible in pods; on a node with no GPU found it is only a hint.
    return FAIL if gpu_kind in GPU_BACKENDS else WARN


def evaluate_docker(text: str | None, gpu_kind: str | None, runtime_problem: Callable[[str], str | None]) -> Check:
    """`text`: daemon.json (None when absent); `runtime_problem(path)`: why the runtime binary is unusable, or None."""
    name = "container runtime"
    path = DOCKER_DAEMON_JSON
    if text is None:
        if gpu_kind == "simulated":
            return Check(name, SKIP, f"docker has no {path} (defaults apply); simulated GPUs need no NVIDIA runtime")
        return Check(name, runtime_severity(gpu_kind),
                     f"k3s runs pods through docker but {path} does not exist: docker has no nvidia runtime "
                     "(\"Unknown runtime specified nvidia\"), GPU pods run without the GPU",
                     f'create {path} with "runtimes": {{"nvidia": {{"path": "{NVIDIA_RUNTIME}"}}}} and '
                     '"default-runtime": "nvidia", then restart docker')
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        # even on a simulated node: docker refuses to start with a daemon.json it cannot parse
        return Check(name, FAIL, f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; "
                     "docker refuses to start with it",
                     f"correct the JSON in {path} (python3 -m json.tool {path} points at the error) and restart docker")
    if not isinstance(doc, dict):
        return Check(name, FAIL, f"{path} must hold a JSON object, got {type(doc).__name__}; docker refuses to start",
                     f"make {path} a JSON object and restart docker")
    default = doc.get("default-runtime")
    if gpu_kind == "simulated":
        return Check(name, SKIP, f"{path} parses (default-runtime {default or 'runc'}); simulated GPUs need no "
                     "NVIDIA runtime")
    found: list[str] = []
    problems: list[str] = []
    edits: list[str] = []
    runtimes = doc.get("runtimes")
    nvidia = runtimes.get("nvidia") if isinstance(runtimes, dict) else None
    if not isinstance(nvidia, dict):
        problems.append("no runtimes.nvidia entry: docker knows no nvidia runtime (\"Unknown runtime specified "
                        "nvidia\"" + ("; with default-runtime nvidia docker does not even start)" if default == "nvidia"
                                     else ")"))
        edits.append(f'add "runtimes": {{"nvidia": {{"path": "{NVIDIA_RUNTIME}"}}}}')
    else:
        binary = nvidia.get("path")
        if not isinstance(binary, str) or not binary.strip():
            problems.append("runtimes.nvidia has no path")
            edits.append(f'set runtimes.nvidia.path to "{NVIDIA_RUNTIME}"')
        else:
            problem = runtime_problem(binary)
            if problem:
                problems.append(f"runtimes.nvidia.path {binary}: {problem}")
                edits.append("install nvidia-container-runtime or point runtimes.nvidia.path at it")
            else:
                found.append(f"runtimes.nvidia is {binary}")
    if default != "nvidia":
        problems.append(f"default-runtime is {default!r}" if default else "no default-runtime (docker uses runc)")
        problems[-1] += ": pods run without the nvidia runtime and see no GPU"
        edits.append('set "default-runtime": "nvidia"')
    else:
        found.append("default-runtime is nvidia")
    if not problems:
        return Check(name, PASS, f"docker ({path}): {', '.join(found)}")
    return Check(name, runtime_severity(gpu_kind), f"docker ({path}): {'; '.join(problems)}",
                 f"{' and '.join(edits)} in {path} and restart docker")


_CONTAINERD_NVIDIA = re.compile(r"""runtimes\.["']?nvidia["']?\s*\]""")
_CONTAINERD_DEFAULT = re.compile(r"""default_runtime_name\s*=\s*["']nvidia["']""")


def evaluate_containerd(text: str | None, gpu_kind: str | None, has_template: bool = False) -> Check:
    name = "container runtime"
    path = K3S_CONTAINERD_CONFIG
    if gpu_kind == "simulated":
        return Check(name, SKIP, "k3s's containerd runs the pods; simulated GPUs need no NVIDIA runtime")
    if text is None:
        return Check(name, WARN, f"k3s has not generated {path} (k3s not started yet, or it uses another "
                     "containerd)", "start k3s (systemctl start k3s or k3s-agent) and check again")
    template = f" (generated from {K3S_CONTAINERD_TEMPLATE})" if has_template else ""
    if _CONTAINERD_NVIDIA.search(text):
        default = (": it is containerd's default runtime" if _CONTAINERD_DEFAULT.search(text)
                   else ": pods select it with runtimeClassName: nvidia")
        return Check(name, PASS, f"k3s's containerd has an nvidia runtime{template}{default}")
    return Check(name, WARN, f"{path}{template} has no nvidia runtime: k3s adds one at start only when "
                 f"{NVIDIA_RUNTIME} exists",
                 f"install nvidia-container-runtime ({NVIDIA_RUNTIME}) and restart k3s")


def binary_problem(settings: Settings, path: str) -> str | None:
    """Why the runtime binary docker would run is unusable, or None. Relative names go through PATH."""
    candidates = [path] if path.startswith("/") else [f"{d}/{path}" for d in PATH_DIRS]
    for candidate in candidates:
        host = host_path(settings, candidate)
        if os.path.isfile(host):
            return None if os.access(host, os.X_OK) else f"{candidate} is not executable"
    return "does not exist" if path.startswith("/") else f"not found in {':'.join(PATH_DIRS)}"


def runtime_in_use(k3s: K3sConfig, has_daemon_json: bool, has_containerd_config: bool) -> str | None:
    """"docker", "containerd" or None (neither is configured here)."""
    if k3s.docker:
        return "docker"
    if k3s.files or has_containerd_config:
        return "containerd"
    return "docker" if has_daemon_json else None


def check_container_runtime(settings: Settings, k3s: K3sConfig, gpu_kind: str | None) -> Check:
    daemon_json = read_text(host_path(settings, DOCKER_DAEMON_JSON))
    containerd = read_text(host_path(settings, K3S_CONTAINERD_CONFIG))
    which = runtime_in_use(k3s, daemon_json is not None, containerd is not None)
    if which == "docker":
        return evaluate_docker(daemon_json, gpu_kind, lambda p: binary_problem(settings, p))
    if which == "containerd":
        has_template = os.path.exists(host_path(settings, K3S_CONTAINERD_TEMPLATE))
        return evaluate_containerd(containerd, gpu_kind, has_template)
    return Check("container runtime", SKIP, f"found neither k3s configuration, {K3S_CONTAINERD_CONFIG} nor "
                 f"{DOCKER_DAEMON_JSON}: no container runtime to check")


# ---------------------------------------------------------------- GPU isolation

ISOLATION_FIX = (f'in {toolkit_config.CONFIG} set {toolkit_config.ENVVAR_KEY} = false and '
                 f'{toolkit_config.VOLUME_MOUNTS_KEY} = true, and leave deviceListStrategy out of the plugin\'s '
                 'config (or set volume-mounts); the image does this with GPU_K8S_GPU_ISOLATION = "1"')


def evaluate_isolation(gpu_kind: str | None, l4t: str, config: toolkit_config.RuntimeConfig,
                       strategies: Sequence[str]) -> Check:
    """Does a pod get only the GPUs allocated to it? The runtime must ignore an unprivileged container's own
    NVIDIA_VISIBLE_DEVICES (every CUDA image sets it to "all"), and the plugin's hand-over must reach it."""
    name = "GPU isolation"
    if gpu_kind not in GPU_BACKENDS:
        return Check(name, SKIP, "no NVIDIA GPU discovered")
    choice = handover.choose(strategies, gpu_kind, l4t, config)
    if not choice.strategies:
        return Check(name, FAIL, f"{choice.why}: the plugin refuses to start on it (GPU pods would start without "
                     "their GPU)", ISOLATION_FIX)
    chosen = ", ".join(choice.strategies)
    how = f"the plugin chose {chosen} ({choice.why})" if tuple(strategies) == (DEVICE_LIST_AUTO,) else \
        f"the plugin hands GPUs over as {chosen}"
    if handover.legacy_runtime(gpu_kind, l4t):
        return Check(name, WARN, f"L4T {l4t}: the Nano's runtime (toolkit 1.0.5) gives the GPU to any container "
                     f"that sets NVIDIA_VISIBLE_DEVICES, allocated or not; it has no setting that refuses it ({how})",
                     "let only trusted workloads run on this node (docs/layer.md, \"GPU isolation\")")
    if not config.present:
        return Check(name, FAIL, f"no {toolkit_config.CONFIG}: the runtime runs on its defaults, which give every GPU "
                     f"to any container that sets NVIDIA_VISIBLE_DEVICES, requested or not ({how})", ISOLATION_FIX)
    if config.accept_envvar_unprivileged:
        return Check(name, WARN, f"{toolkit_config.ENVVAR_KEY} is true: any container that sets "
                     f"NVIDIA_VISIBLE_DEVICES (every CUDA image does) gets every GPU without requesting one ({how})",
                     ISOLATION_FIX)
    reached = ", ".join(handover.reaching(choice.strategies, config))
    return Check(name, PASS, f"unprivileged containers' NVIDIA_VISIBLE_DEVICES is ignored; {how}; the {reached} "
                 f"hand-over reaches the runtime (mode {config.mode})")


def check_isolation(settings: Settings, gpu_kind: str | None, l4t: str) -> Check:
    return evaluate_isolation(gpu_kind, l4t, toolkit_config.read(settings.host_root), settings.device_list_strategy)


# ---------------------------------------------------------------- `gpu-device-plugin runtime-config`


def runtime_settings_command(expect: Sequence[str], root: str) -> int:
    """Exit status 0 only when config.toml, as the runtime reads it, has every KEY=VALUE in force (the unit
    docker and k3s require on Jetson runs this); 1 naming each one that is not, 2 on a malformed one."""
    pairs = []
    for item in expect:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"gpu-device-plugin runtime-config: --expect {item!r} must be KEY=VALUE "
                  "(e.g. accept-nvidia-visible-devices-as-volume-mounts=true)", file=sys.stderr)
            return 2
        pairs.append((key, value))
    problems = toolkit_config.not_in_force(toolkit_config.read_text(root), pairs)
    if problems:
        for problem in problems:
            print(f"gpu-device-plugin runtime-config: {problem}", file=sys.stderr)
        print(f"gpu-device-plugin runtime-config: the NVIDIA runtime would run without these settings; set them with "
              f"nvidia-ctk config --config-file={toolkit_config.CONFIG} --in-place --set KEY=VALUE (on Jetson "
              "the image's drop-in for nvidia-container-setup.service does at boot: journalctl -u "
              "nvidia-container-setup)", file=sys.stderr)
        return 1
    print(f"{toolkit_config.CONFIG}: in force: {', '.join(f'{k}={v}' for k, v in pairs)}")
    return 0
