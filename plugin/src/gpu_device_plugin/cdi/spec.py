"""CDI (Container Device Interface) spec for the GPUs, so runtimes can inject them by name.

Allocate's cdi-cri / cdi-annotations strategies hand the runtime names `<cdi_kind>=<name>`
(`policy.runtime_id`); this module writes the spec that gives those names meaning. It is
pure apart from `read_csv_files`, `write_spec`, `remove_spec` and
`sync_spec`: GPUs, settings and CSV texts in, a plain dict (the CDI JSON document) out.

Choices, with the why:
- cdiVersion is the lowest version the spec's content needs (0.5.0 for device names that
  start with a digit, 0.6.0 if the class has a dot), so the oldest CDI libraries in
  containerd/CRI-O still load it; the CDI loader rejects a spec whose version is lower
  than what its fields need, and older loaders reject versions they do not know.
- Each GPU appears twice where its index and ID differ ("0" and "GPU-...") so both
  `--device-id-strategy` values resolve without rewriting the spec.
- NVML GPUs are not written here: the NVIDIA Container Toolkit's generated spec names them
  with the driver's libraries and hooks (toolkit_spec). `build_spec` still describes them
  (`/dev/nvidiaN` per GPU, control nodes spec-wide) for tools that want the node list.
- Tegra: the container runtime's CSV files (`dev`, `lib`, `sym`, `dir` lines) describe the
  platform, not one GPU, so they also go in the spec-wide edits; `dev` becomes a device
  node, the rest read-only bind mounts at the same path. Entries missing on the host are
  dropped (the runtime fails a container whose CDI device node or mount source is absent,
  and L4T's CSV files list nodes of every Jetson model).
- Simulated GPUs have no device nodes; an env edit `SIMULATED_GPU_<index>=<id>` keeps the
  device valid (CDI refuses devices with no edits) and lets smoke tests see the injection.
"""

import contextlib
import errno
import glob
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ..config.settings import Settings
from ..host.paths import host_path_exists
from ..model import Gpu
from .names import DEVICE_NAME, split_kind

log = logging.getLogger(__name__)

CSV_DIR = "/etc/nvidia-container-runtime/host-files-for-container.d"
CSV_KINDS = ("dev", "lib", "sym", "dir")
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
DEVICE_PERMISSIONS = "rw"  # read/write is all a GPU node needs; CDI's default also grants mknod
SPEC_MODE = 0o644
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")

NVML_GPU_NODE = r"/dev/nvidia\d+"  # a GPU's own node; patterns are compiled on use (re caches)
_TEMP_SUFFIX = ".tmp"  # not .json/.yaml, so a runtime watching the dir never loads a half-written file

Warn = Callable[[str], None]


class CsvEntry(NamedTuple):
    kind: str  # dev | lib | sym | dir
    path: str  # absolute host path, also the path inside the container
    source: str  # "<file>:<line>" for messages


# ---------------------------------------------------------------- CSV files


def parse_csv(text: str, source: str = "csv") -> tuple[list[CsvEntry], list[str]]:
    """Entries of one CSV file and the malformed lines it had ("<source>:<n>: <line>")."""
    entries: list[CsvEntry] = []
    bad: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind, sep, path = (part.strip() for part in line.partition(","))
        # the runtime splits on the first comma only, so a path may itself contain commas
        if not sep or kind not in CSV_KINDS or not path.startswith("/"):
            bad.append(f"{source}:{number}: {line!r}")
            continue
        entries.append(CsvEntry(kind, os.path.normpath(path), f"{source}:{number}"))
    return entries, bad


def read_csv_files(root: str = "/", warn: Warn | None = None) -> dict[str, str]:
    """{file name: text} of the runtime's CSV files under `root`; {} when there are none."""
    warn = warn or log.warning
    pattern = os.path.join(root, CSV_DIR.lstrip("/"), "*.csv")
    files: dict[str, str] = {}
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                files[os.path.basename(path)] = f.read()
        except OSError as exc:
            # one unreadable file must not cost the others; the spec is then missing its entries
            warn(f"CDI: cannot read {path} ({exc.strerror}); its entries are left out of the spec")
    return files


RUNTIME_CONFIG = "/etc/nvidia-container-runtime/config.toml"
_ALT_ROOTS = r"(?m)^\s*alt-roots\s*=\s*\[([^\]]*)\]"


def read_alt_roots(root: str = "/") -> list[str]:
    """`modes.csv.alt-roots` of the runtime's config (meta-tegra sets its passthrough tree there); [] without.

    The file is TOML; this one key is a flat list of strings, read with a pattern because
    Python 3.10 (kirkstone's) has no TOML parser in the standard library."""
    try:
        with open(os.path.join(root, RUNTIME_CONFIG.lstrip("/")), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    match = re.search(_ALT_ROOTS, text)
    roots = re.findall(r"""["']([^"']+)["']""", match.group(1)) if match else []
    return [r for r in roots if r.startswith("/")]


# ---------------------------------------------------------------- building the spec


def device_names(gpu: Gpu) -> list[str]:
    """CDI names of one GPU: its index, and its ID where that differs (see runtime_id)."""
    return list(dict.fromkeys((str(gpu.index), gpu.id)))


def minimum_version(spec: Mapping[str, Any]) -> str:
    """Lowest cdiVersion whose loader accepts what this spec uses (mirrors the CDI library's checks)."""
    _, _, klass = str(spec.get("kind", "")).partition("/")
    if "." in klass or spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices", [])):
        return "0.6.0"
    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    if any(str(d.get("name", ""))[:1].isdigit() for d in spec.get("devices", [])) or any(
        node.get("hostPath") for e in edits for node in e.get("deviceNodes", [])
    ):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def _node(path: str) -> dict[str, Any]:
    return {"path": path, "permissions": DEVICE_PERMISSIONS}


def _mount(host: str, container: str) -> dict[str, Any]:
    return {"hostPath": host, "containerPath": container, "options": list(MOUNT_OPTIONS)}


def _edits(nodes: Iterable[str] = (), mounts: Iterable[tuple[str, str]] = (),
           env: Iterable[str] = ()) -> dict[str, Any]:
    """`mounts`: (host path, container path) pairs."""
    edits: dict[str, Any] = {}
    node_list = list(dict.fromkeys(nodes))
    # sorted by container path so a directory is mounted before files under it and the output is stable
    mount_list = sorted(dict.fromkeys(mounts), key=lambda m: (m[1], m[0]))
    env_list = list(dict.fromkeys(env))
    if env_list:
        edits["env"] = env_list
    if node_list:
        edits["deviceNodes"] = [_node(p) for p in node_list]
    if mount_list:
        edits["mounts"] = [_mount(host, container) for host, container in mount_list]
    return edits


def _csv_edits(csv_files: Mapping[str, str], exists: Callable[[str], bool], gpu_nodes: set[str],
               warn: Warn, alt_roots: Sequence[str] = ()) -> tuple[list[str], list[tuple[str, str]]]:
    """(device nodes, (host, container) mounts) from the CSV files, minus what the host lacks or the GPUs
    already carry. A file under an alternate root (meta-tegra's passthrough tree) wins over the rootfs copy,
    as it does in the runtime's own CSV mode."""
    nodes: list[str] = []
    mounts: list[tuple[str, str]] = []
    missing: list[str] = []
    for name in sorted(csv_files):
        entries, bad = parse_csv(csv_files[name], name)
        if bad:
            warn(f"CDI: skipped {len(bad)} malformed CSV line(s) (want '<dev|lib|sym|dir>, /absolute/path'): "
                 + "; ".join(bad))
        for entry in entries:
            if entry.kind == "dev":
                if not exists(entry.path):
                    missing.append(entry.path)
                elif entry.path not in gpu_nodes:
                    nodes.append(entry.path)
                continue
            # lib, dir and sym alike: a bind mount follows a symlink, so a `sym` entry shows the
            # library it points to at the link's path, which is all a loader needs
            sources = [os.path.join(alt, entry.path.lstrip("/")) for alt in alt_roots] + [entry.path]
            source = next((candidate for candidate in sources if exists(candidate)), "")
            if source:
                mounts.append((source, entry.path))
            else:
                missing.append(entry.path)
    if missing:
        # expected: L4T's CSV files list nodes and libraries of every Jetson model and JetPack option
        log.debug("CDI: %d CSV entries not on this host, left out: %s", len(missing), ", ".join(missing))
    return nodes, mounts


def build_spec(gpus: Sequence[Gpu], settings: Settings, csv_files: Mapping[str, str] | None = None,
               exists: Callable[[str], bool] = lambda path: True, warn: Warn | None = None,
               alt_roots: Sequence[str] = ()) -> dict[str, Any]:
    """The CDI spec for `gpus` under `settings.cdi_kind`. Pure: `csv_files` and `exists` bring the host in.

    `csv_files` ({file name: text}, see read_csv_files) and `alt_roots` (read_alt_roots) only matter
    when a GPU is Tegra.
    Malformed CSV lines are skipped and reported through `warn` (default: log a warning).
    Raises ValueError if the result would not be a valid spec (e.g. no GPUs, bad kind).
    """
    warn = warn or log.warning
    usable = sorted((g for g in gpus if not g.mig_enabled), key=lambda g: (g.index, g.id))
    if not usable:
        # a CDI spec with no devices is invalid; the caller removes the spec instead
        raise ValueError("CDI: no GPU that can be handed out whole (none found, or all MIG-enabled); "
                         "nothing to describe")
    devices: list[dict[str, Any]] = []
    shared_nodes: list[str] = []
    shared_mounts: list[tuple[str, str]] = []
    for gpu in usable:
        own = list(gpu.device_nodes)
        if gpu.backend == "nvml":
            own = [n for n in gpu.device_nodes if re.fullmatch(NVML_GPU_NODE, n)]
            shared_nodes += [n for n in gpu.device_nodes if n not in own]
        # CDI refuses a device with no edits; a GPU with no node of its own is named in the env instead
        prefix = "SIMULATED_GPU" if gpu.backend == "simulated" else "CDI_GPU"
        env = [f"{prefix}_{gpu.index}={gpu.id}"] if gpu.backend == "simulated" or not own else []
        edits = _edits(nodes=own, env=env)
        devices.extend({"name": name, "containerEdits": edits} for name in device_names(gpu))
    if any(g.backend == "tegra" for g in usable):
        if not csv_files:
            warn(f"CDI: no CSV files in {CSV_DIR}: containers get the GPU's device nodes but no CUDA driver "
                 "libraries; install the NVIDIA container runtime's CSV files (nvidia-container-csv-*)")
        gpu_nodes = {n for g in usable for n in g.device_nodes}
        csv_nodes, shared_mounts = _csv_edits(csv_files or {}, exists, gpu_nodes, warn, alt_roots)
        shared_nodes += csv_nodes
    spec: dict[str, Any] = {"cdiVersion": "", "kind": settings.cdi_kind, "devices": devices}
    shared = _edits(nodes=shared_nodes, mounts=shared_mounts)
    if shared:
        spec["containerEdits"] = shared
    spec["cdiVersion"] = minimum_version(spec)
    validate_spec(spec)
    return spec


# ---------------------------------------------------------------- validation


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _check_edits(edits: Any, where: str) -> list[str]:
    if not isinstance(edits, dict):
        return [f"{where}: containerEdits must be a mapping"]
    problems = []
    for node in edits.get("deviceNodes", []):
        for key in ("path", "hostPath"):
            value = node.get(key)
            if (key == "path" or value is not None) and not str(value or "").startswith("/"):
                problems.append(f"{where}: device node {key} {value!r} is not an absolute path")
        if str(node.get("permissions", "")).strip("rwm"):
            problems.append(f"{where}: device node {node.get('path')!r} permissions must be letters of 'rwm'")
    for mount in edits.get("mounts", []):
        for key in ("hostPath", "containerPath"):
            if not str(mount.get(key) or "").startswith("/"):
                problems.append(f"{where}: mount {key} {mount.get(key)!r} is not an absolute path")
    for var in edits.get("env", []):
        if str(var).find("=") <= 0:
            problems.append(f"{where}: env entry {var!r} must be NAME=value")
    return problems


def validate_spec(spec: Mapping[str, Any]) -> None:
    """Raise ValueError listing every way `spec` would be refused by a CDI loader (or by our rules)."""
    problems: list[str] = []
    kind = str(spec.get("kind", ""))
    try:
        split_kind(kind)
    except ValueError as exc:
        problems.append(str(exc))
    version = str(spec.get("cdiVersion", ""))
    if version not in KNOWN_VERSIONS:
        problems.append(f"cdiVersion {version!r} is not a released CDI version ({', '.join(KNOWN_VERSIONS)})")
    elif _version_key(version) < _version_key(minimum_version(spec)):
        problems.append(f"cdiVersion {version} is too old for what the spec uses; needs {minimum_version(spec)}")
    devices = spec.get("devices") or []
    if not devices:
        problems.append("a CDI spec needs at least one device")
    seen: set[str] = set()
    for i, device in enumerate(devices):
        name = str(device.get("name", ""))
        where = f"device {name!r}" if name else f"devices[{i}]"
        if not re.fullmatch(DEVICE_NAME, name):
            problems.append(f"{where}: invalid CDI device name (letters, digits, '_', '-', '.', ':'; "
                            "must start and end with a letter or digit)")
        if name in seen:
            problems.append(f"{where}: device name used twice")
        seen.add(name)
        edits = device.get("containerEdits")
        if not edits:
            problems.append(f"{where}: a CDI device needs at least one edit (device node, mount or env)")
        else:
            problems += _check_edits(edits, where)
    if spec.get("containerEdits"):
        problems += _check_edits(spec["containerEdits"], "spec-wide containerEdits")
    if problems:
        raise ValueError(f"invalid CDI spec for {kind or '(no kind)'}: " + "; ".join(problems))


# ---------------------------------------------------------------- files


def spec_path(spec_dir: str, kind: str) -> str:
    """<spec_dir>/<vendor>-<class>.json, the CDI library's own naming for one vendor/class."""
    vendor, klass = split_kind(kind)
    return os.path.join(spec_dir, f"{vendor}-{klass}.json")


def _remove_stale_temps(path: str) -> None:
    # a SIGKILL between creating and renaming the temp file leaves one behind; clear it next time
    directory, base = os.path.split(path)
    remove_stale_temps(directory, f".{glob.escape(base)}.*")


def remove_stale_temps(directory: str, pattern: str) -> None:
    """Remove the temporary files (`pattern` + our suffix) a killed writer left in `directory`."""
    for stale in glob.glob(os.path.join(glob.escape(directory), f"{pattern}{_TEMP_SUFFIX}")):
        with contextlib.suppress(OSError):
            os.unlink(stale)


def write_spec(spec: Mapping[str, Any], spec_dir: str, kind: str) -> str:
    """Write `spec` atomically as <spec_dir>/<vendor>-<class>.json (mode 0644); returns the path.

    Readers see the old file or the new one, never a partial one. Raises ValueError for an
    invalid spec and OSError (message names the path and the fix) when it cannot be written;
    no temporary file is left behind either way.
    """
    if spec.get("kind") != kind:
        raise ValueError(f"CDI spec kind {spec.get('kind')!r} does not match the kind to write, {kind!r}")
    return write_spec_file(spec, spec_path(spec_dir, kind))


def write_spec_file(spec: Mapping[str, Any], path: str, clean_stale: bool = True) -> str:
    """`write_spec` under a file name of the caller's (the DRA driver's one spec per claim). `clean_stale`:
    remove temporary files a killed writer left for this path (a caller writing many files cleans once)."""
    validate_spec(spec)
    spec_dir = os.path.dirname(path)
    data = (json.dumps(spec, indent=2, sort_keys=False) + "\n").encode()
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return path  # unchanged: rewriting would only make every runtime reload it
    except OSError:
        pass
    import tempfile  # here: with shutil, random, bz2 and lzma it is ~4 ms of a start that writes nothing

    tmp = ""
    try:
        os.makedirs(spec_dir, mode=0o755, exist_ok=True)
        if clean_stale:
            _remove_stale_temps(path)
        fd, tmp = tempfile.mkstemp(dir=spec_dir, prefix=f".{os.path.basename(path)}.", suffix=_TEMP_SUFFIX)
        try:
            os.fchmod(fd, SPEC_MODE)  # mkstemp makes 0600; runtimes not running as root must read it
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)  # the data is on disk before the rename makes it visible
        finally:
            os.close(fd)
        os.replace(tmp, path)
        tmp = ""
        _fsync_dir(spec_dir)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OSError(exc.errno or errno.EIO,
                      f"cannot write CDI spec {path}: {reason}; make {spec_dir} writable by the plugin "
                      "(it needs root or write access there) or point --cdi-spec-dir at a directory the "
                      "container runtime reads (/var/run/cdi or /etc/cdi)") from exc
    finally:
        if tmp:  # any failure after mkstemp, interrupts included: no temp file outlives this call
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return path


def _fsync_dir(directory: str) -> None:
    # the rename itself survives a power cut only once the directory is synced; best effort
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_spec(spec_dir: str, kind: str) -> bool:
    """Delete our spec (CDI switched off, or shutdown); True if a file was removed."""
    return remove_spec_file(spec_path(spec_dir, kind))


def remove_spec_file(path: str, clean_stale: bool = True) -> bool:
    if clean_stale:
        _remove_stale_temps(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise OSError(exc.errno, f"cannot remove CDI spec {path}: {exc.strerror}; delete it by hand, or "
                      "runtimes keep injecting devices that may no longer exist") from exc
    return True


def cdi_enabled(settings: Settings) -> bool:
    return any(s.startswith("cdi-") for s in settings.device_list_strategy)


def sync_spec(gpus: Sequence[Gpu], settings: Settings, warn: Warn | None = None) -> str | None:
    """Make the spec on disk match `gpus` and `settings`: written when a cdi-* strategy is on and
    there is a Jetson or simulated GPU to describe (returns its path), removed otherwise (returns None)."""
    # NVML GPUs are named in the NVIDIA Container Toolkit's spec (toolkit_spec), never in ours
    gpus = [g for g in gpus if g.backend != "nvml"]
    if not cdi_enabled(settings) or not any(not g.mig_enabled for g in gpus):
        remove_spec(settings.cdi_spec_dir, settings.cdi_kind)
        return None
    root = settings.host_root
    tegra = any(g.backend == "tegra" for g in gpus)
    csv_files = read_csv_files(root, warn) if tegra else {}
    alt_roots = read_alt_roots(root) if tegra else []
    spec = build_spec(gpus, settings, csv_files, exists=lambda p: host_path_exists(root, p), warn=warn,
                      alt_roots=alt_roots)
    return write_spec(spec, settings.cdi_spec_dir, settings.cdi_kind)
