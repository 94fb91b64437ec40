"""`gpu-device-plugin check`: is this node set up so that GPU pods get scheduled and see the GPU?

Each check answers one question a person asks while a GPU pod stays Pending (or runs without
the GPU) and says what to do when the answer is wrong. The `evaluate_*` functions are pure:
what was read (file text, socket state, discovery results) in, a `Check` out. `run_checks`
does the reads, under `settings.host_root`, and calls them in the order a GPU pod depends on
them: configuration, discovery, device nodes, registration with the kubelet, container runtime.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import socket
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import config, policy
from .config import ConfigError, Settings
from .discovery.base import DiscoveryError
from .discovery.select import choose
from .health.tegra import check_device_node
from .model import Gpu

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
STATUSES = (PASS, WARN, FAIL, SKIP)

# Paths on the node (read under settings.host_root).
DOCKER_DAEMON_JSON = "/etc/docker/daemon.json"
K3S_CONFIG = "/etc/rancher/k3s/config.yaml"
K3S_CONFIG_DROPINS = "/etc/rancher/k3s/config.yaml.d"
K3S_CONTAINERD_CONFIG = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
K3S_CONTAINERD_TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
K3S_UNITS = tuple(
    f"{base}/{unit}"
    for base in ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")
    for unit in ("k3s.service", "k3s-agent.service")
)
CSV_DIR = "/etc/nvidia-container-runtime/host-files-for-container.d"
NVIDIA_RUNTIME = "/usr/bin/nvidia-container-runtime"
CHECKPOINT_NAME = "kubelet_internal_checkpoint"
# Where docker looks up a runtime path that is not absolute (a typical root PATH).
PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

GPU_BACKENDS = ("tegra", "nvml")  # backends whose pods need the NVIDIA container runtime

PLUGIN_FIX = "is gpu-device-plugin.service running? journalctl -u gpu-device-plugin"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | warn | fail | skip
    detail: str  # what was found
    fix: str = ""  # one line: what the person should do (empty on pass)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Check status must be one of {', '.join(STATUSES)}, got {self.status!r}")


# ---------------------------------------------------------------------------------------------
# Small helpers


def _host(settings: Settings, path: str) -> str:
    return os.path.join(settings.host_root, path.lstrip("/"))


def _read_text(path: str) -> str | None:
    """The file's text, or None when it does not exist; other errors propagate to the guard."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def _short_list(items: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _runtime_severity(gpu_kind: str | None) -> str:
    # Without the nvidia runtime a real GPU is invisible in pods; on a node with no GPU found it is only a hint.
    return FAIL if gpu_kind in GPU_BACKENDS else WARN


# ---------------------------------------------------------------------------------------------
# 1. config file


def evaluate_config_file(path: str, text: str | None, read_error: str = "") -> Check:
    name = "config file"
    if not path:
        return Check(name, SKIP, "no config file given: flags, environment and defaults only")
    if text is None:
        why = read_error or "it does not exist"
        return Check(name, FAIL, f"cannot read {path}: {why}",
                     "fix the path given with --config-file / CONFIG_FILE, or create the file")
    try:
        parsed = config.parse_file(text, source=path)
    except ConfigError as exc:
        return Check(name, FAIL, str(exc),
                     f"correct the field named in {path}; a running plugin keeps its last good configuration "
                     "until then, a restarted one will not start")
    fields = [".".join(o.file_path) for o in config.OPTIONS if o.attr in parsed.values]
    if parsed.time_slicing is not None:
        fields.append(f"sharing.timeSlicing (replicas {parsed.time_slicing.replicas})")
    sets = f"sets {', '.join(fields)}" if fields else "sets nothing (defaults apply)"
    if parsed.warnings:
        return Check(name, WARN, f"{path} parses and {sets}; " + "; ".join(parsed.warnings),
                     f"remove or correct the fields named in {path}: the plugin ignores them")
    return Check(name, PASS, f"{path} parses and {sets}")


# ---------------------------------------------------------------------------------------------
# 2. discovery


@dataclass(frozen=True)
class Discovered:
    strategy: str
    backend: str | None  # None: auto found no GPU backend
    reason: str  # choose()'s one line
    gpus: tuple[Gpu, ...] = ()
    error: str = ""  # DiscoveryError text
    resource: str = config.DEFAULT_RESOURCE
    advertised: int = 0  # devices the plugin would advertise (replicas included)


def evaluate_discovery(found: Discovered) -> Check:
    name = "discovery"
    if found.backend is None:
        # auto on a node without a GPU is legitimate; the plugin idles and registers nothing.
        return Check(name, WARN, f"{found.reason}; the plugin advertises no {found.resource}",
                     "if this node has an NVIDIA GPU, load its driver and see `gpu-device-plugin discover`; "
                     "a node without a GPU needs nothing")
    if found.error or not found.gpus:
        # the strategy named a backend, or auto's probe saw the hardware: finding nothing is a fault
        what = found.error or f"{found.backend}: discovery returned no usable GPU"
        return Check(name, FAIL, f"{found.reason}; {what}; pods requesting {found.resource} stay Pending "
                     f"(Insufficient {found.resource})",
                     "do what the error says, then confirm with `gpu-device-plugin discover` and restart "
                     "gpu-device-plugin.service")
    gpus = ", ".join(f"{g.name} ({g.id})" for g in found.gpus)
    detail = (f"{found.reason}; found {len(found.gpus)} GPU(s): {gpus}; "
              f"advertised as {found.resource} x {found.advertised}")
    if found.advertised == 0:
        return Check(name, WARN, detail + " (MIG-enabled GPUs are not handed out whole)",
                     "disable MIG on the GPU (nvidia-smi -mig 0) to hand it out whole")
    if found.resource != config.DEFAULT_RESOURCE:
        detail += f" (time-slicing renames it: pods must request {found.resource}, not {config.DEFAULT_RESOURCE})"
    return Check(name, PASS, detail)


def discover(settings: Settings) -> Discovered:
    """What the daemon would find at start, with the reason and any DiscoveryError text."""
    choice = choose(settings)
    resource = policy.resource_name(settings)
    if choice.backend is None:
        return Discovered(settings.device_discovery_strategy, None, choice.reason, resource=resource)
    try:
        gpus = tuple(choice.backend.discover())
        error = ""
    except DiscoveryError as exc:
        gpus, error = (), str(exc)
    return Discovered(settings.device_discovery_strategy, choice.backend.name, choice.reason, gpus, error,
                      resource, len(policy.advertised_devices(gpus, settings)))


# ---------------------------------------------------------------------------------------------
# 3. device nodes


def evaluate_device_nodes(backend: str | None, nodes: Sequence[str], problems: Sequence[str]) -> Check:
    """`problems`: one line per node that is missing or does not open (from check_device_node)."""
    name = "device nodes"
    if backend == "simulated":
        return Check(name, SKIP, "simulated GPUs have no device nodes")
    if not nodes:
        return Check(name, SKIP, "no GPU discovered, so no device nodes to check")
    if problems:
        fix = ("load the GPU driver (modprobe nvgpu) and check the nodes' owner and mode (ls -l /dev/nvhost-* "
               "/dev/nvmap); the plugin reports the GPU Unhealthy while a node is bad"
               if backend == "tegra" else
               "check the NVIDIA driver with nvidia-smi and that /dev/nvidia* exist (nvidia-modprobe); the plugin "
               "reports the GPU Unhealthy while a node is bad")
        return Check(name, FAIL, "; ".join(problems), fix)
    how = ("control nodes opened, the others checked for presence and access only (opening them powers the GPU up)"
           if backend == "tegra" else "present and accessible")
    return Check(name, PASS, f"{len(nodes)} device node(s) ({_short_list(list(nodes))}): {how}")


def device_node_problems(settings: Settings, gpus: Iterable[Gpu]) -> tuple[list[str], list[str]]:
    """(nodes checked, problems). Reuses the health monitor's rule: only Tegra control nodes are opened."""
    nodes = sorted({node for gpu in gpus for node in gpu.device_nodes})
    problems = [p for p in (check_device_node(_host(settings, n), n) for n in nodes) if p is not None]
    return nodes, problems


# ---------------------------------------------------------------------------------------------
# 4-6. kubelet socket, plugin socket, kubelet checkpoint

LISTENING, MISSING, NOT_SOCKET, REFUSED, UNREACHABLE = "listening", "missing", "not a socket", "refused", "unreachable"


def probe_socket(path: str) -> tuple[str, str]:
    """(state, error text): whether a Unix socket exists at `path` and something accepts on it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return MISSING, ""
    except OSError as exc:
        return UNREACHABLE, exc.strerror or str(exc)
    if not stat.S_ISSOCK(mode):
        return NOT_SOCKET, ""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect(path)
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:
            return REFUSED, ""
        return UNREACHABLE, exc.strerror or str(exc)
    finally:
        sock.close()
    return LISTENING, ""


def evaluate_kubelet_socket(path: str, state: str, error: str = "") -> Check:
    name = "kubelet socket"
    fix = "the kubelet is not running or uses another root dir; set --kubelet-socket"
    if state == LISTENING:
        return Check(name, PASS, f"{path} is a socket and the kubelet accepts connections on it")
    if state == MISSING:
        return Check(name, FAIL, f"no socket at {path}: the plugin cannot register, so the node has no "
                     "GPU capacity", fix + " (k3s: systemctl status k3s or k3s-agent)")
    if state == NOT_SOCKET:
        return Check(name, FAIL, f"{path} exists but is not a socket", fix)
    if state == REFUSED:
        return Check(name, FAIL, f"{path} is a stale socket: nothing accepts connections on it (the kubelet "
                     "stopped or crashed)", "start the kubelet (systemctl restart k3s or k3s-agent), then check "
                     "again")
    return Check(name, WARN, f"cannot connect to {path}: {error}", "run the check as root")


def evaluate_plugin_socket(path: str, state: str, advertised: int, error: str = "") -> Check:
    name = "plugin socket"
    if state == LISTENING:
        return Check(name, PASS, f"{path} is served (the plugin is up)")
    idle = " (expected while discovery finds no GPU: the plugin then serves nothing)" if advertised == 0 else ""
    if state == MISSING:
        return Check(name, WARN, f"no plugin socket at {path}{idle}", PLUGIN_FIX)
    if state == NOT_SOCKET:
        return Check(name, WARN, f"{path} exists but is not a socket{idle}", PLUGIN_FIX)
    if state == REFUSED:
        return Check(name, WARN, f"{path} is a stale socket: the plugin stopped without removing it{idle}",
                     PLUGIN_FIX)
    return Check(name, WARN, f"cannot connect to {path}: {error}", "run the check as root")


def _device_ids(raw: Any) -> list[str]:
    # kubelet >= 1.20 keys device IDs by NUMA node ({"-1": [ids]}); older kubelets store a plain list
    if isinstance(raw, list):
        return [str(i) for i in raw]
    if isinstance(raw, dict):
        return [str(i) for ids in raw.values() if isinstance(ids, list) for i in ids]
    return []


def evaluate_checkpoint(path: str, text: str | None, resource: str) -> Check:
    name = "kubelet checkpoint"
    if text is None:
        return Check(name, SKIP, f"no {path} yet: the kubelet writes it once a device plugin registers")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return Check(name, WARN, f"{path} is not valid JSON ({exc}); the kubelet cannot restore allocations",
                     "the kubelet rewrites it: stop k3s, remove the file, start k3s")
    data = doc.get("Data") if isinstance(doc, dict) else None
    if not isinstance(data, dict):
        return Check(name, WARN, f"{path} has no Data object: not a device manager checkpoint this check knows",
                     "the kubelet rewrites it: stop k3s, remove the file, start k3s")
    registered_raw = data.get("RegisteredDevices")
    registered = registered_raw if isinstance(registered_raw, dict) else {}
    healthy = _device_ids(registered.get(resource))
    entries = data.get("PodDeviceEntries")
    allocated: set[str] = set()
    pods: set[str] = set()
    containers = 0
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("ResourceName") != resource:
            continue
        containers += 1
        pods.add(str(entry.get("PodUID", "")))
        allocated.update(_device_ids(entry.get("DeviceIDs")))
    others = sorted(str(r) for r in registered if r != resource)
    other_text = f"; other resources: {', '.join(others)}" if others else ""
    use = f"{len(allocated)} allocated to {containers} container(s) in {len(pods)} pod(s)"
    if not healthy:
        return Check(name, WARN, f"the kubelet records no healthy {resource} device ({use}): pods requesting it "
                     f"stay Pending with Insufficient {resource}{other_text}",
                     f"start the plugin and fix the discovery / device node lines above; {PLUGIN_FIX}")
    full = " (all in use: another GPU pod waits until one of these ends)" if set(healthy) <= allocated else ""
    return Check(name, PASS, f"the kubelet records {len(healthy)} healthy {resource} device(s) "
                 f"({_short_list(healthy)}), {use}{full}{other_text}")


# ---------------------------------------------------------------------------------------------
# 7. k3s configuration


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
            docker, docker_from = _truthy(doc["docker"]), path
        if "default-runtime" in doc:
            runtime, runtime_from = str(doc["default-runtime"] or "").strip(), path
    for path, text in units:
        for command in _EXEC_START.findall(text.replace("\\\n", " ")):
            flag = _DOCKER_FLAG.search(command)
            if flag:
                docker, docker_from = flag.group(1) is None or _truthy(flag.group(1)), path
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
    main = _read_text(_host(settings, K3S_CONFIG))
    if main is not None:
        configs.append((K3S_CONFIG, main))
    # k3s reads config.yaml.d/*.yaml (and .yml) in name order after config.yaml
    dropin_dir = _host(settings, K3S_CONFIG_DROPINS)
    for path in sorted(glob.glob(dropin_dir + "/*.yaml") + glob.glob(dropin_dir + "/*.yml")):
        text = _read_text(path)
        if text is not None:
            configs.append((f"{K3S_CONFIG_DROPINS}/{os.path.basename(path)}", text))
    units: list[tuple[str, str]] = []
    for unit in K3S_UNITS:
        dropins = sorted(glob.glob(_host(settings, unit + ".d") + "/*.conf"))
        for path in (unit, *(f"{unit}.d/{os.path.basename(d)}" for d in dropins)):
            text = _read_text(_host(settings, path))
            if text is not None:
                units.append((path, text))
    return parse_k3s_config(configs, units)


# ---------------------------------------------------------------------------------------------
# 8. container runtime (docker or k3s's containerd)


def evaluate_docker(text: str | None, gpu_kind: str | None, runtime_problem: Callable[[str], str | None]) -> Check:
    """`text`: daemon.json (None when absent); `runtime_problem(path)`: why the runtime binary is unusable, or None."""
    name = "container runtime"
    path = DOCKER_DAEMON_JSON
    if text is None:
        if gpu_kind == "simulated":
            return Check(name, SKIP, f"docker has no {path} (defaults apply); simulated GPUs need no NVIDIA runtime")
        return Check(name, _runtime_severity(gpu_kind),
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
    return Check(name, _runtime_severity(gpu_kind), f"docker ({path}): {'; '.join(problems)}",
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
        host = _host(settings, candidate)
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
    daemon_json = _read_text(_host(settings, DOCKER_DAEMON_JSON))
    containerd = _read_text(_host(settings, K3S_CONTAINERD_CONFIG))
    which = runtime_in_use(k3s, daemon_json is not None, containerd is not None)
    if which == "docker":
        return evaluate_docker(daemon_json, gpu_kind, lambda p: binary_problem(settings, p))
    if which == "containerd":
        has_template = os.path.exists(_host(settings, K3S_CONTAINERD_TEMPLATE))
        return evaluate_containerd(containerd, gpu_kind, has_template)
    return Check("container runtime", SKIP, f"found neither k3s configuration, {K3S_CONTAINERD_CONFIG} nor "
                 f"{DOCKER_DAEMON_JSON}: no container runtime to check")


# ---------------------------------------------------------------------------------------------
# 9. NVIDIA container runtime CSV files (Jetson)

_CSV_DEV = re.compile(r"^\s*dev\s*,", re.MULTILINE)
_CSV_ENTRY = re.compile(r"^\s*(?:lib|sym|dir)\s*,", re.MULTILINE)


def evaluate_csv(gpu_kind: str | None, files: Sequence[tuple[str, str]]) -> Check:
    """`files`: (file name, text) of each *.csv in CSV_DIR."""
    name = "runtime CSV files"
    if gpu_kind != "tegra":
        return Check(name, SKIP, "only Jetson's nvidia runtime mounts files from CSV lists")
    fix = ("install nvidia-container-runtime (it ships l4t.csv) and the *-container-csv packages of the "
           f"libraries pods use (CUDA, cuDNN, TensorRT) into {CSV_DIR}")
    if not files:
        return Check(name, FAIL, f"no *.csv in {CSV_DIR}: the nvidia runtime on Jetson injects only what these "
                     "list, so containers would get no GPU device nodes or CUDA libraries", fix)
    devices = sum(len(_CSV_DEV.findall(text)) for _, text in files)
    others = sum(len(_CSV_ENTRY.findall(text)) for _, text in files)
    names = _short_list(sorted(n for n, _ in files))
    if devices == 0:
        return Check(name, WARN, f"{len(files)} CSV file(s) in {CSV_DIR} ({names}) but none lists a device node "
                     "(dev, /dev/...): containers would get libraries but not the GPU",
                     "install nvidia-container-runtime, whose l4t.csv lists the GPU device nodes")
    return Check(name, PASS, f"{len(files)} CSV file(s) in {CSV_DIR} ({names}): {devices} device node(s), "
                 f"{others} libraries, links and directories")


def read_csv_files(settings: Settings) -> list[tuple[str, str]]:
    out = []
    for path in sorted(glob.glob(_host(settings, CSV_DIR) + "/*.csv")):
        text = _read_text(path)
        if text is not None:
            out.append((os.path.basename(path), text))
    return out


# ---------------------------------------------------------------------------------------------
# Running and reporting


def _crashed(name: str, exc: Exception) -> Check:
    if isinstance(exc, OSError):
        return Check(name, WARN, f"check could not run: {exc}", "run the check as root")
    return Check(name, WARN, f"check could not run: {type(exc).__name__}: {exc}",
                 "report this as a gpu-device-plugin bug, with the output of `gpu-device-plugin discover`")


def _guard(name: str, run: Callable[[], Check]) -> Check:
    # one check that cannot read what it needs must not hide the others
    try:
        return run()
    except Exception as exc:
        return _crashed(name, exc)


def _config_file_check(settings: Settings) -> Check:
    path = settings.config_file
    if not path:
        return evaluate_config_file("", None)
    try:
        with open(path, encoding="utf-8") as f:
            return evaluate_config_file(path, f.read())
    except OSError as exc:
        return evaluate_config_file(path, None, exc.strerror or str(exc))


def run_checks(settings: Settings) -> list[Check]:
    """Every check, in the order a GPU pod depends on them."""
    checks = [_guard("config file", lambda: _config_file_check(settings))]
    try:
        found = discover(settings)
        checks.append(evaluate_discovery(found))
    except Exception as exc:
        found = Discovered(settings.device_discovery_strategy, None, "discovery did not run",
                           resource=policy.resource_name(settings))
        checks.append(_crashed("discovery", exc))
    gpu_kind = found.backend

    def nodes() -> Check:
        checked, problems = device_node_problems(settings, found.gpus)
        return evaluate_device_nodes(gpu_kind, checked, problems)

    def plugin() -> Check:
        state, error = probe_socket(plugin_socket)
        return evaluate_plugin_socket(plugin_socket, state, found.advertised, error)

    socket_dir = os.path.dirname(settings.kubelet_socket) or "/"
    plugin_socket = os.path.join(socket_dir, policy.socket_name(found.resource))
    checkpoint = os.path.join(socket_dir, CHECKPOINT_NAME)
    checks.append(_guard("device nodes", nodes))
    kubelet = settings.kubelet_socket
    checks.append(_guard("kubelet socket", lambda: evaluate_kubelet_socket(kubelet, *probe_socket(kubelet))))
    checks.append(_guard("plugin socket", plugin))
    checks.append(_guard("kubelet checkpoint",
                         lambda: evaluate_checkpoint(checkpoint, _read_text(checkpoint), found.resource)))
    try:
        k3s = read_k3s_config(settings)
        checks.append(evaluate_k3s(k3s, gpu_kind))
    except Exception as exc:
        k3s = K3sConfig()
        checks.append(_crashed("k3s config", exc))
    checks.append(_guard("container runtime", lambda: check_container_runtime(settings, k3s, gpu_kind)))
    checks.append(_guard("runtime CSV files", lambda: evaluate_csv(gpu_kind, read_csv_files(settings))))
    return checks


def format_report(checks: Sequence[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"{check.status.upper():<4}  {check.name}: {check.detail}")
        if check.status in (WARN, FAIL) and check.fix:
            lines.append(f"      fix: {check.fix}")
    counts: Mapping[str, int] = {s: sum(c.status == s for c in checks) for s in STATUSES}
    summary = ", ".join(f"{counts[s]} {s}" for s in STATUSES)
    if counts[FAIL]:
        verdict = "GPU pods will not work until the FAIL lines are fixed (top to bottom)"
    elif counts[WARN]:
        verdict = "no failures; read the WARN lines if GPU pods still stay Pending"
    else:
        verdict = "this node is set up for GPU pods"
    lines.append(f"{len(checks)} checks: {summary}; {verdict}")
    return "\n".join(lines)


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0
