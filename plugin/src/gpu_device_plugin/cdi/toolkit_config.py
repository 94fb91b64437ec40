"""The NVIDIA Container Toolkit's runtime configuration as the runtime reads it.

nvidia-container-runtime (toolkit 1.19/1.20, `api/config/v1`) loads
/etc/nvidia-container-runtime/config.toml over its built-in defaults: a key the file leaves
out keeps the default, so a file that sets only `mode` still hands every GPU to any
container that sets NVIDIA_VISIBLE_DEVICES (`accept-nvidia-visible-devices-envvar-when-
unprivileged` defaults to true). This module reads the three settings that decide how a GPU
reaches a container, merged the same way, and says which of the plugin's hand-overs the
runtime honours for an unprivileged container.

Python 3.10 (kirkstone's) has no TOML parser: `parse_toml` reads the subset nvidia-ctk
writes (tables, key = string, boolean, number or one-line list, comments).
"""

from __future__ import annotations

import os
import re
from typing import Any, NamedTuple

CONFIG = "/etc/nvidia-container-runtime/config.toml"
ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
VOLUME_MOUNTS_KEY = "accept-nvidia-visible-devices-as-volume-mounts"
RUNTIME_TABLE = "nvidia-container-runtime"
MODES = ("auto", "cdi", "jit-cdi", "csv", "legacy")


class RuntimeConfig(NamedTuple):
    """The runtime's effective settings; the defaults are the toolkit's (GetDefault)."""

    present: bool = False  # the file exists (when not, the runtime runs on the defaults)
    mode: str = "auto"
    accept_envvar_unprivileged: bool = True
    accept_volume_mounts: bool = False
    error: str = ""  # why the file is not TOML the runtime could load; "" when it is

    @property
    def isolates(self) -> bool:
        """An unprivileged container's own NVIDIA_VISIBLE_DEVICES is ignored."""
        return not self.error and not self.accept_envvar_unprivileged


class Handover(NamedTuple):
    """How an unprivileged container gets a GPU the toolkit's CDI spec does not name."""

    strategy: str  # a device-list strategy ("volume-mounts", "envvar"), or "" when none works
    why: str


# ---------------------------------------------------------------- TOML (the subset nvidia-ctk writes)

# strings, compiled by re (and cached) on first use: the serve path imports this module, and
# only a start that reads the toolkit's config needs them
_TABLE = r"\[\s*([A-Za-z0-9_.\"'-]+)\s*\]"
_KEY = r"""("[^"]*"|'[^']*'|[A-Za-z0-9_-]+)\s*=\s*(.*)"""


def _strip_comment(line: str) -> str:
    quote = ""
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "#":
            return line[:i]
    return line


def _value(text: str, where: str) -> Any:
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_value(item, where) for item in re.findall(r"""("[^"]*"|'[^']*'|[^,\s]+)""", inner)]
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    raise ValueError(f"{where}: value {text!r} is not a TOML string, boolean, number or list")


def parse_toml(text: str) -> dict[str, dict[str, Any]]:
    """{table: {key: value}} ("" is the top level); ValueError naming the line for anything else."""
    tables: dict[str, dict[str, Any]] = {"": {}}
    current = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).strip()
        if not line:
            continue
        where = f"line {number}"
        table = re.fullmatch(_TABLE, line)
        if table:
            current = ".".join(part.strip("\"'") for part in table.group(1).split("."))
            tables.setdefault(current, {})
            continue
        pair = re.fullmatch(_KEY, line)
        if not pair:
            raise ValueError(f"{where}: {raw.strip()!r} is neither a [table] nor key = value")
        key = pair.group(1).strip("\"'")
        if key in tables[current]:
            raise ValueError(f"{where}: {key} is set twice")
        tables[current][key] = _value(pair.group(2), where)
    return tables


# ---------------------------------------------------------------- the runtime's view


def from_text(text: str | None) -> RuntimeConfig:
    """The effective settings of config.toml's text (None: no file, the defaults apply)."""
    if text is None:
        return RuntimeConfig()
    try:
        tables = parse_toml(text)
    except ValueError as exc:
        return RuntimeConfig(present=True, error=str(exc))
    top = tables.get("", {})
    runtime = tables.get(RUNTIME_TABLE, {})
    defaults = RuntimeConfig(present=True)
    values: dict[str, Any] = {
        "mode": runtime.get("mode", defaults.mode),
        "accept_envvar_unprivileged": top.get(ENVVAR_KEY, defaults.accept_envvar_unprivileged),
        "accept_volume_mounts": top.get(VOLUME_MOUNTS_KEY, defaults.accept_volume_mounts),
    }
    for name, expected in (("mode", str), ("accept_envvar_unprivileged", bool), ("accept_volume_mounts", bool)):
        if not isinstance(values[name], expected):
            return defaults._replace(error=f"{name.replace('_', '-')} must be a TOML {expected.__name__}, "
                                           f"got {values[name]!r}")
    return defaults._replace(**values)


def read_text(root: str = "/") -> str | None:
    """config.toml's text as the runtime opens it (through meta-tegra's link to /run), or None when absent."""
    try:
        with open(os.path.join(root, CONFIG.lstrip("/")), encoding="utf-8", errors="replace") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def read(root: str = "/") -> RuntimeConfig:
    return from_text(read_text(root))


# The toolkit's defaults of the settings an image pins (api/config/v1 GetDefault): a key the file leaves out
# has this value. Any other key must be in the file to be in force.
DEFAULTS: dict[str, Any] = {ENVVAR_KEY: True, VOLUME_MOUNTS_KEY: False, f"{RUNTIME_TABLE}.mode": "auto"}


def not_in_force(text: str | None, expected: list[tuple[str, str]]) -> list[str]:
    """Which `key=value` settings (nvidia-ctk --set's form: a dotted key names a table) the runtime would
    not run with, each saying what it would take instead; [] when all are in force."""
    if text is None:
        return [f"no {CONFIG}: the runtime runs on the toolkit's defaults"]
    try:
        tables = parse_toml(text)
    except ValueError as exc:
        return [f"{CONFIG} does not load ({exc}): the runtime fails every container"]
    problems = []
    for key, want in expected:
        table, _, leaf = key.rpartition(".")
        values = tables.get(table, {})
        have = values[leaf] if leaf in values else DEFAULTS.get(key)
        shown = "not set" if have is None else _toml(have) + ("" if leaf in values else " (the default)")
        if have is None or _toml(have) != want:
            problems.append(f"{key} is {shown}, not {want}")
    return problems


def _toml(value: Any) -> str:
    """A value as nvidia-ctk --set takes it: true/false, or the string itself."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def unnamed_gpu_handover(config: RuntimeConfig) -> Handover:
    """How a discrete (NVML) GPU the toolkit's CDI spec does not name can still reach an unprivileged
    container, under this configuration (toolkit internal/config/image/cuda_image.go VisibleDevices,
    internal/modifier/cdi.go)."""
    if config.error:
        return Handover("", f"{CONFIG} does not load ({config.error}): the runtime fails every container")
    if config.mode == "cdi":
        return Handover("", "the nvidia runtime's mode is cdi: it resolves every request, NVIDIA_VISIBLE_DEVICES "
                            "and volume mounts included, against the spec files only")
    if config.accept_volume_mounts:
        return Handover("volume-mounts", f"mode {config.mode}: the runtime builds the GPU's edits itself from a "
                                         "volume-mount request")
    if config.accept_envvar_unprivileged:
        return Handover("envvar", f"mode {config.mode}: the runtime takes NVIDIA_VISIBLE_DEVICES from any "
                                  "container and builds the GPU's edits itself")
    return Handover("", f"the runtime ({CONFIG}) accepts neither volume mounts nor NVIDIA_VISIBLE_DEVICES from "
                        "unprivileged containers")
