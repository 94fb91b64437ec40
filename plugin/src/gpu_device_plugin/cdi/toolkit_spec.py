"""The NVIDIA Container Toolkit's CDI spec (`nvidia-ctk cdi generate`): where it is, what it names.

A discrete GPU's container needs the driver's libraries, firmware and hooks, which only the
toolkit's generated spec carries (ours would hold bare device nodes). So for NVML GPUs, and
for Jetsons whose toolkit generated a CSV-mode spec, Allocate names the toolkit's devices
(`nvidia.com/gpu=<uuid|index>`) instead of writing a spec of its own.

A spec can be absent (the boot unit has not run yet, no toolkit) or stale (made for another
driver version or before the GPUs changed): then a GPU is not "covered" and the caller falls
back after saying why in one line: a Jetson to our own spec; an NVML GPU to the hand-over the
nvidia runtime resolves without a spec under its configuration (toolkit_config: volume mounts
or NVIDIA_VISIBLE_DEVICES in mode auto), and when there is none (mode cdi) Allocate refuses
with the reason rather than start a container without its GPU.
"""

import glob
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ..config.settings import Settings
from ..model import Gpu
from . import toolkit_config
from .names import TOOLKIT_KIND, jetson_toolkit_name
from .spec import NVML_GPU_NODE, cdi_enabled, spec_path

log = logging.getLogger(__name__)

# CDI's default spec directories, lowest priority first: a device named in both is taken from the later one
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
REGENERATE = "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml"
_DRIVER_ARG = r"--host-driver-version=(\S+)"  # compiled on use (re caches)


class ToolkitSpec(NamedTuple):
    """What the toolkit's spec says: device name -> the device nodes it injects, and for what driver."""

    path: str
    kind: str
    mtime: float
    devices: Mapping[str, tuple[str, ...]]
    driver_version: str = ""  # from the enable-cuda-compat hook; "" when the spec does not say (CSV mode)
    libraries: int = 0  # spec-wide mounts: the driver libraries a container gets
    # what the DRA driver copies into a claim's spec: each device's containerEdits, the spec-wide ones
    device_edits: Mapping[str, Mapping[str, Any]] = {}
    common_edits: Mapping[str, Any] = {}
    cdi_version: str = ""


class Coverage(NamedTuple):
    """For each GPU ID: its qualified CDI name in the toolkit's spec, or why it has none."""

    names: Mapping[str, str]
    problems: Mapping[str, str]


def _strings(items: Any) -> list[str]:
    return [str(item) for item in items] if isinstance(items, list) else []


def _edits(document: Any) -> dict[str, Any]:
    edits = document.get("containerEdits") if isinstance(document, dict) else None
    return edits if isinstance(edits, dict) else {}


def _node_paths(edits: Mapping[str, Any]) -> tuple[str, ...]:
    nodes = edits.get("deviceNodes")
    return tuple(str(n.get("path")) for n in nodes if isinstance(n, dict) and n.get("path")) if isinstance(
        nodes, list) else ()


def parse_spec(text: str, path: str, mtime: float = 0.0) -> ToolkitSpec:
    """One spec file (YAML or JSON: YAML reads both). ValueError naming the file when it is not a CDI spec."""
    import yaml  # only where CDI is on: keeps the idle footprint down

    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML/JSON ({str(exc).splitlines()[0]}); regenerate it: "
                         f"{REGENERATE}") from None
    if not isinstance(document, dict) or not isinstance(document.get("kind"), str):
        raise ValueError(f"{path} is not a CDI spec (no kind); remove it or regenerate it: {REGENERATE}")
    devices: dict[str, tuple[str, ...]] = {}
    device_edits: dict[str, dict[str, Any]] = {}
    for device in document.get("devices") or []:
        if isinstance(device, dict) and device.get("name") is not None:
            devices[str(device["name"])] = _node_paths(_edits(device))
            device_edits[str(device["name"])] = _edits(device)
    common = _edits(document)
    driver = ""
    for hook in common.get("hooks") or []:
        for arg in _strings(hook.get("args")) if isinstance(hook, dict) else []:
            match = re.fullmatch(_DRIVER_ARG, arg)
            if match:
                driver = match.group(1)
    mounts = common.get("mounts")
    return ToolkitSpec(path, document["kind"], mtime, devices, driver,
                       len(mounts) if isinstance(mounts, list) else 0, device_edits, common,
                       str(document.get("cdiVersion") or ""))


def spec_files(root: str, dirs: Sequence[str] = SPEC_DIRS) -> list[str]:
    """Host paths of the spec files, lowest priority first."""
    found: list[str] = []
    for directory in dirs:
        base = os.path.join(root, directory.lstrip("/"))
        found += sorted(p for p in glob.glob(os.path.join(glob.escape(base), "*")) if p.endswith(SPEC_SUFFIXES))
    return found


def read_specs(root: str = "/", kind: str = TOOLKIT_KIND, dirs: Sequence[str] = SPEC_DIRS,
               skip: Sequence[str] = (), warn: Callable[[str], None] | None = None) -> list[ToolkitSpec]:
    """The specs of `kind` under `root`, lowest priority first; unreadable or broken files are reported
    through `warn` and left out. `skip`: host paths not to read (our own spec)."""
    warn = warn or log.warning
    specs: list[ToolkitSpec] = []
    skipped = {os.path.realpath(p) for p in skip}
    for path in spec_files(root, dirs):
        if os.path.realpath(path) in skipped:
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            mtime = os.stat(path).st_mtime
        except OSError as exc:
            warn(f"CDI: cannot read {path} ({exc.strerror}); its devices are left out")
            continue
        if kind not in text:  # cheap: most specs in the directory are someone else's
            continue
        try:
            spec = parse_spec(text, path, mtime)
        except ValueError as exc:
            warn(f"CDI: {exc}")
            continue
        if spec.kind == kind:
            specs.append(spec)
    return specs


def _gpu_node(gpu: Gpu) -> str:
    return next((n for n in gpu.device_nodes if re.fullmatch(NVML_GPU_NODE, n)), "")


def match_gpu(gpu: Gpu, specs: Sequence[ToolkitSpec], id_strategy: str) -> tuple[str, str]:
    """(device name in the toolkit's spec, "") or ("", why none fits), for one GPU."""
    if not specs:
        return "", "no spec of the NVIDIA Container Toolkit"
    devices: dict[str, tuple[str, ...]] = {}
    owner: dict[str, ToolkitSpec] = {}
    for spec in specs:  # later (higher priority) specs win, as in the CDI cache
        for name, nodes in spec.devices.items():
            devices[name], owner[name] = nodes, spec
    where = ", ".join(dict.fromkeys(s.path for s in specs))
    index = str(gpu.index)
    if gpu.backend == "tegra":
        name = jetson_toolkit_name(devices, gpu.index, gpu.properties.get("uuid", ""), id_strategy)
        if not name:
            return "", f"{where} names no device {index}" + (" or " + gpu.properties["uuid"]
                                                             if gpu.properties.get("uuid") else "")
        return stale_for_driver(gpu, name, owner[name])
    wanted = [gpu.id, index] if id_strategy == "uuid" else [index, gpu.id]
    name = next((n for n in wanted if n in devices), "")
    if not name:
        return "", f"{where} names neither {gpu.id} nor {index} (made before this GPU was installed?)"
    node = _gpu_node(gpu)
    spec_nodes = [n for n in devices[name] if re.fullmatch(NVML_GPU_NODE, n)]
    if node and spec_nodes and node not in spec_nodes:
        return "", (f"{owner[name].path} gives {name} the node {spec_nodes[0]} but NVML says this GPU is {node} "
                    "(the GPUs changed since the spec was made)")
    return stale_for_driver(gpu, name, owner[name])


def stale_for_driver(gpu: Gpu, name: str, spec: ToolkitSpec) -> tuple[str, str]:
    """(name, "") or ("", why): a spec whose hooks name another driver version than the GPU's is stale
    (CSV-mode specs name none; on Thor an NVML-mode spec does, and the driver comes with each L4T)."""
    driver = gpu.properties.get("driver_version", "")
    if driver and spec.driver_version and driver != spec.driver_version:
        return "", (f"{spec.path} was made for driver {spec.driver_version}, the loaded driver is {driver}: it "
                    "would mount libraries that no longer exist")
    return name, ""


def coverage(gpus: Sequence[Gpu], specs: Sequence[ToolkitSpec], id_strategy: str) -> Coverage:
    names: dict[str, str] = {}
    problems: dict[str, str] = {}
    for gpu in gpus:
        if gpu.backend not in ("nvml", "tegra") or gpu.mig_enabled:  # MIG GPUs are never handed out whole
            continue
        name, problem = match_gpu(gpu, specs, id_strategy)
        if name:
            names[gpu.id] = f"{TOOLKIT_KIND}={name}"
        else:
            problems[gpu.id] = problem
    return Coverage(names, problems)


class ToolkitSpecs:
    """The toolkit's specs under a host root, re-read only when a spec directory or file changes.

    Allocate asks on every call; the answer costs a few stat() calls while nothing changed.
    A spec that appears after the plugin started (the boot unit runs after the driver loads)
    is picked up on the next Allocate.
    """

    def __init__(self, root: str = "/", dirs: Sequence[str] = SPEC_DIRS, skip: Sequence[str] = ()) -> None:
        self.root = root
        self.dirs = tuple(dirs)
        self.skip = tuple(skip)
        self._lock = threading.Lock()
        self._key: tuple[Any, ...] | None = None
        self._specs: list[ToolkitSpec] = []
        self._files: list[str] = []
        self._told: set[str] = set()
        self._config_key: tuple[Any, ...] | None = None
        self._config = toolkit_config.RuntimeConfig()

    def _stamp(self) -> tuple[Any, ...]:
        stamps: list[Any] = []
        for directory in self.dirs:
            try:
                stamps.append(os.stat(os.path.join(self.root, directory.lstrip("/"))).st_mtime_ns)
            except OSError:
                stamps.append(None)
        # a file added, removed or renamed over changes its directory's mtime; one rewritten in
        # place changes its own: the files seen last time are all that needs a stat (no listing)
        for path in self._files:
            try:
                stat = os.stat(path)
                stamps.append((path, stat.st_mtime_ns, stat.st_size))
            except OSError:
                stamps.append((path, None))
        return tuple(stamps)

    def specs(self) -> list[ToolkitSpec]:
        key = self._stamp()
        with self._lock:
            if key != self._key:
                self._files = spec_files(self.root, self.dirs)
                fresh = self._stamp()  # taken before reading: a change during the read is seen next time
                self._specs = read_specs(self.root, dirs=self.dirs, skip=self.skip)
                self._key = fresh
            return self._specs

    def runtime_config(self) -> toolkit_config.RuntimeConfig:
        """The nvidia runtime's configuration under the root, read again only when the file changes."""
        path = os.path.join(self.root, toolkit_config.CONFIG.lstrip("/"))
        try:
            stat = os.stat(path)
            key: tuple[Any, ...] = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except OSError:
            key = ()
        with self._lock:
            if key != self._config_key:
                self._config = toolkit_config.read(self.root)
                self._config_key = key
            return self._config

    def handover(self) -> toolkit_config.Handover:
        """How an NVML GPU the spec does not name reaches a container (or why nothing does)."""
        return toolkit_config.unnamed_gpu_handover(self.runtime_config())

    def namer(self, id_strategy: str) -> Callable[[Gpu], str | None]:
        """For Allocate: a GPU's qualified toolkit name, or None (said once per reason in the log)."""
        specs = self.specs()

        def name(gpu: Gpu) -> str | None:
            found, problem = match_gpu(gpu, specs, id_strategy)
            if found:
                return f"{TOOLKIT_KIND}={found}"
            self.tell(gpu, problem)
            return None

        return name

    def tell(self, gpu: Gpu, problem: str) -> None:
        handover = self.handover() if gpu.backend == "nvml" else None
        told = gpu.id + problem + (handover.strategy if handover else "")
        with self._lock:
            if told in self._told:
                return
            self._told.add(told)
        # a Jetson without the toolkit's spec is served by ours as designed (the Nano has no other);
        # an NVML GPU without it loses CDI, which someone set up on purpose
        level = logging.ERROR if gpu.backend == "nvml" else logging.INFO
        log.log(level, "%s", fallback_message(gpu, problem, handover))


def fallback_message(gpu: Gpu, problem: str, handover: toolkit_config.Handover | None = None) -> str:
    """One line: why the GPU is not in the toolkit's spec and what its containers get instead."""
    if gpu.backend != "nvml":
        how = "its containers get the plugin's own spec (device nodes and CSV files)"
    elif handover is None or handover.strategy:
        strategy = handover.strategy if handover else "envvar"
        why = f" ({handover.why})" if handover else ""
        how = f"its containers get it through the {strategy} hand-over instead{why}"
    else:
        how = f"containers asking for it are refused at admission: {handover.why}"
    return (f"CDI: GPU {gpu.index} ({gpu.id}) is not in the NVIDIA Container Toolkit's spec: {problem}; {how}; "
            f"regenerate the spec: {REGENERATE}")


def refusal(gpu_ids: Sequence[str], handover: toolkit_config.Handover) -> str:
    """Allocate's error when no hand-over reaches an unnamed GPU (the kubelet shows it on the pod)."""
    return (f"GPU {', '.join(gpu_ids)} is not in the NVIDIA Container Toolkit's CDI spec and {handover.why}; "
            f"regenerate the spec: {REGENERATE}")


_SHARED: dict[tuple[str, str], ToolkitSpecs] = {}
_SHARED_LOCK = threading.Lock()


def for_host(root: str, own_spec: str = "") -> ToolkitSpecs:
    """One cache per host root, shared by the daemon's start-up report and every Allocate."""
    with _SHARED_LOCK:
        key = (root, own_spec)
        if key not in _SHARED:
            _SHARED[key] = ToolkitSpecs(root, skip=(own_spec,) if own_spec else ())
        return _SHARED[key]


def own_spec(settings: Settings) -> str:
    return spec_path(settings.cdi_spec_dir, settings.cdi_kind)


def namer(settings: Settings) -> Callable[[Gpu], str | None] | None:
    """What Allocate hands policy.allocate: None while no cdi-* strategy is on (then no file is read)."""
    if not cdi_enabled(settings):
        return None
    return for_host(settings.host_root, own_spec(settings)).namer(settings.device_id_strategy)


def fallback(settings: Settings, gpu_ids: Sequence[str] = ()) -> tuple[str, str]:
    """policy.allocate's `fallback` for this host: the strategy the runtime resolves without a spec, or
    ("", the refusal naming the GPUs)."""
    if not cdi_enabled(settings):
        return ("envvar", "")  # unused: no cdi-* strategy, nothing to fall back from
    handover = for_host(settings.host_root, own_spec(settings)).handover()
    return (handover.strategy, "" if handover.strategy else refusal(gpu_ids or ("(requested)",), handover))


def report(gpus: Sequence[Gpu], settings: Settings) -> Coverage:
    """Log, once at start and after each reload, which GPUs the toolkit's spec names and which fall back."""
    toolkit = for_host(settings.host_root, own_spec(settings))
    found = coverage(gpus, toolkit.specs(), settings.device_id_strategy)
    for gpu in gpus:
        if gpu.id in found.names:
            log.info("CDI: GPU %d (%s) goes to containers as %s, from the NVIDIA Container Toolkit's spec",
                     gpu.index, gpu.id, found.names[gpu.id])
        elif gpu.id in found.problems:
            toolkit.tell(gpu, found.problems[gpu.id])
    return found
