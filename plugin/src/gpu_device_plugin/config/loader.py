"""Settings from flags, environment and a YAML file (precedence: flag > env > file > default).

The file format is the official NVIDIA plugin's `version: v1` config (`flags`, `flags.plugin`,
`sharing.timeSlicing`) so users can bring theirs; our own options live under `flags.plugin`
with camelCase names. Parsing is pure: text/dicts in, `Settings` or `ConfigError` out.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ..cdi.names import TOOLKIT_KIND, split_kind
from . import cache
from .settings import (
    ALLOCATION_APIS,
    ALLOCATION_POLICIES,
    DEFAULT_RESOURCE,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_AUTO,
    DEVICE_LIST_STRATEGIES,
    DISCOVERY_STRATEGIES,
    MAX_REPLICAS,
    MAX_SIMULATED_GPUS,
    ConfigError,
    Settings,
    TimeSlicing,
)

# ---------------------------------------------------------------- value parsers


def _bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _choice(choices: Sequence[str]) -> Callable[[Any], str]:
    def parse(text: Any) -> str:
        value = str(text).strip()
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}; got {text!r}")
        return value

    return parse


def _list_of(choices: Sequence[str]) -> Callable[[Any], tuple[str, ...]]:
    def parse(value: Any) -> tuple[str, ...]:
        items = value if isinstance(value, (list, tuple)) else str(value).split(",")
        out = tuple(str(i).strip() for i in items if str(i).strip())
        bad = [i for i in out if i not in choices]
        if bad or not out:
            raise ValueError(f"must be one or more of {', '.join(choices)}; got {value!r}")
        return tuple(dict.fromkeys(out))

    return parse


def _device_list(value: Any) -> tuple[str, ...]:
    """One or more hand-overs, or "auto" alone (the one the node's NVIDIA runtime honours)."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    if [str(i).strip() for i in items if str(i).strip()] == [DEVICE_LIST_AUTO]:
        return (DEVICE_LIST_AUTO,)
    try:
        return _list_of(DEVICE_LIST_STRATEGIES)(value)
    except ValueError:
        raise ValueError(f"must be {DEVICE_LIST_AUTO} (the hand-over the node's NVIDIA runtime honours) or one or "
                         f"more of {', '.join(DEVICE_LIST_STRATEGIES)}; got {value!r}") from None


def _simulated_gpus(text: Any) -> int:
    """0 (no simulated GPUs) or the count the simulated strategy needs: one range in every message."""
    try:
        return _int_range(0, MAX_SIMULATED_GPUS)(text)
    except ValueError:
        raise ValueError(f"must be 1..{MAX_SIMULATED_GPUS} (0: none), got {text!r}") from None


def _int_range(lo: int, hi: int) -> Callable[[Any], int]:
    def parse(text: Any) -> int:
        if isinstance(text, bool):
            raise ValueError(f"must be a whole number {lo}..{hi}, got {text!r}")
        try:
            value = int(str(text).strip())
        except ValueError:
            raise ValueError(f"must be a whole number {lo}..{hi}, got {text!r}") from None
        if not lo <= value <= hi:
            raise ValueError(f"must be {lo}..{hi}, got {value}")
        return value

    return parse


def _seconds(text: Any) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*", str(text))
    if not match:
        raise ValueError(f"must be a duration such as 30, 30s, 500ms or 2m; got {text!r}")
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


def _abs_path(text: Any) -> str:
    value = str(text).strip()
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, got {text!r}")
    return value.rstrip("/") or "/"


def _optional_path(text: Any) -> str:
    return "" if str(text).strip() == "" else _abs_path(text)


def _address(text: Any) -> str:
    value = str(text).strip()
    if value == "":
        return ""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be HOST:PORT (e.g. 127.0.0.1:9402) or empty to disable; got {text!r}")
    return value


def _cdi_kind(text: Any) -> str:
    value = str(text).strip()
    split_kind(value)
    return value


def _prefix(text: Any) -> str:
    value = str(text).strip()
    if not value.endswith("/"):
        raise ValueError(f"must end with '/', e.g. cdi.k8s.io/; got {text!r}")
    return value


class Option(NamedTuple):
    attr: str  # Settings attribute
    flag: str
    env: str
    file_path: tuple[str, ...]  # where it lives in the v1 YAML file
    parse: Callable[[Any], Any]
    help: str
    metavar: str = ""
    yaml_type: type | None = None  # in the file the value must be this YAML type (no quoted numbers)

    @property
    def is_switch(self) -> bool:
        """A true/false option: `--flag` alone means true."""
        return self.parse is _bool


OPTIONS: tuple[Option, ...] = (
    Option("kubelet_socket", "--kubelet-socket", "KUBELET_SOCKET", ("flags", "plugin", "kubeletSocket"),
           _abs_path, "kubelet registration socket; its directory also holds ours", "PATH"),
    Option("device_discovery_strategy", "--device-discovery-strategy", "DEVICE_DISCOVERY_STRATEGY",
           ("flags", "deviceDiscoveryStrategy"), _choice(DISCOVERY_STRATEGIES),
           "how GPUs are found: auto, tegra, nvml or simulated", "STRATEGY"),
    Option("fail_on_init_error", "--fail-on-init-error", "FAIL_ON_INIT_ERROR", ("flags", "failOnInitError"),
           _bool, "exit non-zero when no GPU can be discovered (default: keep running, register nothing)",
           "BOOL"),
    Option("device_list_strategy", "--device-list-strategy", "DEVICE_LIST_STRATEGY",
           ("flags", "plugin", "deviceListStrategy"), _device_list,
           "how allocated GPUs reach the container runtime: auto (default: the hand-over the node's NVIDIA "
           "runtime honours, from its config.toml), or envvar, volume-mounts, cdi-annotations, cdi-cri "
           "(comma-separated)", "LIST"),
    Option("device_id_strategy", "--device-id-strategy", "DEVICE_ID_STRATEGY",
           ("flags", "plugin", "deviceIDStrategy"), _choice(DEVICE_ID_STRATEGIES),
           "what NVIDIA_VISIBLE_DEVICES names: uuid or index", "STRATEGY"),
    Option("pass_device_specs", "--pass-device-specs", "PASS_DEVICE_SPECS", ("flags", "plugin", "passDeviceSpecs"),
           _bool, "also hand the GPU's device nodes to the kubelet (needed with the CPU manager)", "BOOL"),
    Option("allocation_policy", "--shared-devices-allocation-policy", "SHARED_DEVICES_ALLOCATION_POLICY",
           ("flags", "plugin", "sharedDevicesAllocationPolicy"), _choice(ALLOCATION_POLICIES),
           "preferred allocation: distributed (spread over GPUs) or packed", "POLICY"),
    Option("cdi_annotation_prefix", "--cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX",
           ("flags", "plugin", "cdiAnnotationPrefix"), _prefix, "annotation prefix for cdi-annotations", "PREFIX"),
    Option("cdi_kind", "--cdi-kind", "CDI_KIND", ("flags", "plugin", "cdiKind"), _cdi_kind,
           "CDI kind (vendor/class) of the devices we name and the spec we write", "KIND"),
    Option("cdi_spec_dir", "--cdi-spec-dir", "CDI_SPEC_DIR", ("flags", "plugin", "cdiSpecDir"), _abs_path,
           "where the CDI spec is written when a cdi-* strategy is on", "DIR"),
    Option("simulated_gpus", "--simulated-gpus", "SIMULATED_GPUS", ("flags", "plugin", "simulatedGpus"),
           _simulated_gpus,
           f"number of fake GPUs for the simulated strategy (1..{MAX_SIMULATED_GPUS})", "N", int),
    Option("simulated_health_dir", "--simulated-health-dir", "SIMULATED_HEALTH_DIR",
           ("flags", "plugin", "simulatedHealthDir"), _optional_path,
           "simulated GPUs: a file named <device-id> here holding 'Unhealthy' marks it unhealthy", "DIR"),
    Option("host_root", "--host-root", "HOST_ROOT", ("flags", "plugin", "hostRoot"), _abs_path,
           "read sysfs, device tree and /dev under this prefix (for containers and tests)", "PATH"),
    Option("metrics_address", "--metrics-address", "METRICS_ADDRESS", ("flags", "plugin", "metricsAddress"),
           _address,
           "serve /healthz and /metrics on HOST:PORT, e.g. 127.0.0.1:9402; :9402 means loopback (off when empty)",
           "HOST:PORT"),
    Option("health_recovery_period", "--health-recovery-period", "HEALTH_RECOVERY_PERIOD",
           ("flags", "plugin", "healthRecoveryPeriod"), _seconds,
           "how long an unhealthy GPU must behave before it is Healthy again", "DURATION"),
    Option("allocation_api", "--allocation-api", "ALLOCATION_API", ("flags", "plugin", "allocationApi"),
           _choice(ALLOCATION_APIS),
           "which API gives this node's GPUs to pods: device-plugin (nvidia.com/gpu), dra (ResourceClaims), or "
           "both (claims, and nvidia.com/gpu served through DRA); the device plugin registers only with "
           "device-plugin, the DRA driver publishes only with dra or both", "API"),
    Option("gds_enabled", "--gds-enabled", "GDS_ENABLED", ("flags", "gdsEnabled"), _bool,
           "give allocated containers GPUDirect Storage's /dev/nvidia-fs* (NVIDIA_GDS=enabled; default: disabled)",
           "BOOL"),
    Option("mofed_enabled", "--mofed-enabled", "MOFED_ENABLED", ("flags", "mofedEnabled"), _bool,
           "give allocated containers every /dev/infiniband/uverbs* (NVIDIA_MOFED=enabled; default: disabled)",
           "BOOL"),
    Option("gdrcopy_enabled", "--gdrcopy-enabled", "GDRCOPY_ENABLED", ("flags", "gdrcopyEnabled"), _bool,
           "give allocated containers GDRCopy's /dev/gdrdrv (NVIDIA_GDRCOPY=enabled; default: disabled)", "BOOL"),
    Option("nvswitch_enabled", "--nvswitch-enabled", "NVSWITCH_ENABLED", ("flags", "plugin", "nvswitchEnabled"),
           _bool, "give allocated containers every /dev/nvidia-nvswitch* (NVIDIA_NVSWITCH=enabled; default: "
           "disabled)", "BOOL"),
    Option("log_level", "--log-level", "LOG_LEVEL", ("flags", "plugin", "logLevel"),
           _choice(("debug", "info", "warning", "error")), "debug, info, warning or error", "LEVEL"),
)

_BY_ATTR = {o.attr: o for o in OPTIONS}

_SHARING_KEYS = {"renameByDefault", "failRequestsGreaterThanOne", "resources"}


# ---------------------------------------------------------------- sources


class FileConfig(NamedTuple):
    values: Mapping[str, Any]  # attr -> parsed value
    time_slicing: TimeSlicing | None
    warnings: tuple[str, ...]


def parse_file(text: str, source: str = "config file", cache_dir: str = "") -> FileConfig:
    """Parse a v1 YAML/JSON config file. Raises ConfigError naming the field.

    `cache_dir`: where the parsed document of this exact text may be kept (config.cache)."""
    doc = cache.document(text, lambda t: _parse_yaml(t, source), cache_dir)
    if doc is None:
        raise ConfigError(f"{source} is empty: it needs at least 'version: v1' (the official plugin's format)")
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: top level must be a mapping with 'version: v1', got {_kind(doc)}")
    version = doc.get("version")
    if version != "v1":
        raise ConfigError(f"{source}: 'version' must be v1 (the official plugin's config format), got {version!r}")
    _check_sections(doc, source)
    _check_mig_strategy(doc, source)
    values = _parse_options(lambda o: _file_value(doc, o), lambda o: f"{source}: {'.'.join(o.file_path)}")
    unknown = _unknown_keys(doc)
    time_slicing, sharing_unknown = _parse_time_slicing(doc, source)
    warnings = tuple(
        [f"{source}: ignoring fields this plugin does not support: {', '.join(unknown + sharing_unknown)}"]
        if unknown or sharing_unknown
        else []
    )
    return FileConfig(values, time_slicing, warnings)


def _parse_yaml(text: str, source: str) -> Any:
    import yaml  # only when a file is used and not cached: start-up time

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(exc, source)) from None


def _yaml_error(exc: Exception, source: str) -> str:
    """One line naming the file and the line, without PyYAML's '<unicode string>' stand-in."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{source} line {mark.line + 1} column {mark.column + 1}" if mark is not None else source
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: not valid YAML ({problem}); fix the syntax there"


def _kind(value: Any) -> str:
    """What a YAML value is, in YAML's words."""
    if isinstance(value, bool):
        return f"a boolean ({value!r})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    return {"list": "a list", "dict": "a mapping"}.get(type(value).__name__, type(value).__name__)


# Sections that must be mappings when present (an empty `flags:` is allowed and means nothing).
_SECTIONS = (("flags",), ("flags", "plugin"), ("sharing",), ("sharing", "timeSlicing"))


def _check_sections(doc: Mapping[str, Any], source: str) -> None:
    for path in _SECTIONS:
        node = _dig(doc, path)
        if node is not None and not isinstance(node, dict):
            example = {"flags": "flags: {failOnInitError: true}", "flags.plugin": "plugin: {passDeviceSpecs: true}",
                       "sharing": "sharing: {timeSlicing: ...}",
                       "sharing.timeSlicing": "timeSlicing: {resources: [...]}"}[".".join(path)]
            raise ConfigError(f"{source}: {'.'.join(path)} must be a mapping (e.g. {example}), got {_kind(node)}")


def _file_value(doc: Mapping[str, Any], option: Option) -> Any:
    """The YAML value of an option; numbers must be YAML numbers, as the official plugin requires."""
    value = _dig(doc, option.file_path)
    if option.yaml_type is int and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{'.'.join(option.file_path)} must be a whole number, got {_kind(value)}; "
                          "write it without quotes")
    return value


def _dig(doc: Mapping[str, Any], path: Sequence[str]) -> Any:
    node: Any = doc
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _check_mig_strategy(doc: Mapping[str, Any], source: str) -> None:
    """Official files carry `migStrategy: none`, which is what this plugin does (MIG-enabled GPUs are
    never handed out), so it is accepted and nothing is kept; any other strategy is refused."""
    value = _dig(doc, ("flags", "migStrategy"))
    if value is not None and value != "none":
        raise ConfigError(f"{source}: flags.migStrategy {value!r} is not supported: MIG-enabled GPUs are not "
                          "handed out; set migStrategy: none or remove it")


def _unknown_keys(doc: Mapping[str, Any]) -> list[str]:
    """Fields of the official format (or typos) we do not act on, so one warning can name them."""
    known: dict[tuple[str, ...], set[str]] = {(): {"version", "flags", "sharing"},
                                              ("flags",): {"plugin", "migStrategy"}, ("sharing",): {"timeSlicing"}}
    for option in OPTIONS:
        known.setdefault(option.file_path[:-1], set()).add(option.file_path[-1])
    out = []
    for section, keys in known.items():
        node = _dig(doc, section) if section else doc
        if isinstance(node, dict):
            out += [".".join((*section, str(k))) for k in node if k not in keys]
    return sorted(out)


def _parse_time_slicing(doc: Mapping[str, Any], source: str) -> tuple[TimeSlicing | None, list[str]]:
    node = _dig(doc, ("sharing", "timeSlicing"))
    if node is None:
        return None, []
    where = f"{source}: sharing.timeSlicing"
    if not isinstance(node, dict):
        raise ConfigError(f"{where} must be a mapping")
    path = "sharing.timeSlicing"
    unknown = [f"{path}.{k}" for k in node if k not in _SHARING_KEYS]
    try:
        rename = _bool(node.get("renameByDefault", False))
        fail_gt1 = _bool(node.get("failRequestsGreaterThanOne", False))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    resources = node.get("resources") or []
    if not isinstance(resources, list):
        raise ConfigError(f"{where}.resources must be a list of {{name, replicas}}")
    replicas = 1
    seen: dict[str, int] = {}
    for i, entry in enumerate(resources):
        at = f"{where}.resources[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at} must be a mapping with name and replicas")
        name = entry.get("name")
        if name != DEFAULT_RESOURCE:
            raise ConfigError(f"{at}.name must be {DEFAULT_RESOURCE} (the resource this plugin serves), got {name!r}")
        if name in seen:
            raise ConfigError(f"{at}: {name} is already listed at resources[{seen[name]}]; keep one entry per "
                              "resource")
        seen[name] = i
        raw = entry.get("replicas")
        if isinstance(raw, str):
            raise ConfigError(f"{at}.replicas must be a whole number 1..{MAX_REPLICAS}, got {_kind(raw)}; "
                              "write it without quotes")
        try:
            replicas = _int_range(1, MAX_REPLICAS)(raw)
        except ValueError as exc:
            raise ConfigError(f"{at}.replicas {exc}") from None
        unknown += [f"{path}.resources[{i}].{k}" for k in entry if k not in ("name", "replicas")]
    return TimeSlicing(replicas, rename, fail_gt1), unknown


def _parse_options(lookup: Callable[[Option], Any], where: Callable[[Option], str]) -> dict[str, Any]:
    """Parse every option `lookup` has a value for; the error names the source via `where`."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw = lookup(option)
        if raw is None:
            continue
        try:
            values[option.attr] = option.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{where(option)} {exc}") from None
    return values


def parse_env(environ: Mapping[str, str]) -> dict[str, Any]:
    return _parse_options(lambda o: environ.get(o.env) or None, lambda o: f"environment {o.env}")


def parse_flags(namespace: Any) -> dict[str, Any]:
    """Flag values from an argparse namespace (None: not given)."""
    return _parse_options(lambda o: getattr(namespace, o.attr, None), lambda o: o.flag)


def build(flags: Mapping[str, Any], env: Mapping[str, Any], file: FileConfig | None,
          config_file: str = "") -> Settings:
    """Merge the three sources (flag > env > file > default) and check cross-field rules."""
    merged: dict[str, Any] = {}
    if file is not None:
        merged.update(file.values)
    merged.update(env)
    merged.update(flags)
    settings = Settings(config_file=config_file)._replace(**merged)
    if file is not None and file.time_slicing is not None:
        settings = settings._replace(time_slicing=file.time_slicing)
    return validate(settings, origin={**{k: "file" for k in (file.values if file else {})},
                                      **{k: "env" for k in env}, **{k: "flag" for k in flags}})


def validate(settings: Settings, origin: Mapping[str, str] | None = None) -> Settings:
    origin = origin or {}

    def where(attr: str) -> str:
        option = _BY_ATTR[attr]
        return {"flag": option.flag, "env": f"environment {option.env}",
                "file": f"config file {'.'.join(option.file_path)}"}.get(origin.get(attr, ""), option.flag)

    if settings.device_discovery_strategy == "simulated" and settings.simulated_gpus < 1:
        raise ConfigError(
            f"{where('simulated_gpus')} must be 1..{MAX_SIMULATED_GPUS} with the simulated discovery strategy, "
            f"got {settings.simulated_gpus} (e.g. --simulated-gpus 2)"
        )
    if settings.simulated_gpus and settings.device_discovery_strategy != "simulated":
        raise ConfigError(
            f"{where('simulated_gpus')} only applies to --device-discovery-strategy simulated "
            f"(strategy is {settings.device_discovery_strategy})"
        )
    if settings.device_discovery_strategy != "auto":
        conflict = backend_conflict(settings, settings.device_discovery_strategy)
        if conflict:
            raise ConfigError(conflict.replace(_BY_ATTR["cdi_kind"].flag, where("cdi_kind"), 1))
    return settings


def backend_conflict(settings: Settings, backend: str) -> str | None:
    """Why `settings` cannot serve GPUs of `backend` (a one-line error naming the fix), or None.

    NVML GPUs are named in the NVIDIA Container Toolkit's spec (kind nvidia.com/gpu; only it
    carries the driver's libraries); Jetson and simulated GPUs also get the plugin's own spec.
    Ours under the toolkit's kind would name devices "0", "all"... twice, and CDI refuses
    devices defined twice, so that is refused here, not half-served.
    """
    cdi = [s for s in settings.device_list_strategy if s.startswith("cdi-")]
    if backend == "nvml" or not cdi or settings.cdi_kind != TOOLKIT_KIND:
        return None
    return (f"{_BY_ATTR['cdi_kind'].flag} {TOOLKIT_KIND} is the NVIDIA Container Toolkit's own kind, but the plugin "
            f"writes its own spec for {backend} GPUs and CDI refuses devices defined in two specs; keep the "
            "default meta-gpu-k8s.io/gpu (the plugin still names the toolkit's devices where its spec covers the GPU)")


def load(argv_namespace: Any, environ: Mapping[str, str],
         read_file: Callable[[str], str]) -> tuple[Settings, tuple[str, ...]]:
    """All three sources; returns the settings and any warnings to log."""
    flags = parse_flags(argv_namespace)
    env = parse_env(environ)
    from_flag = argv_namespace.config_file is not None
    path = argv_namespace.config_file if from_flag else environ.get("CONFIG_FILE", "")
    file_config = None
    if path:
        try:
            text = read_file(path)
        except OSError as exc:
            drop = "drop --config-file" if from_flag else "unset the CONFIG_FILE environment variable"
            raise ConfigError(f"config file {path}: cannot read it ({exc.strerror}); fix the path or {drop}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
        file_config = parse_file(text, source=f"config file {path}", cache_dir=cache.cache_dir(environ))
    settings = build(flags, env, file_config, config_file=path)
    return settings, (file_config.warnings if file_config else ())
