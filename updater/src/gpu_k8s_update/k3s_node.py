"""The name k3s registers this node under, found the way k3s finds it, so the gate asks the
API server about the right Node.

k3s takes, from strongest to weakest: `node-name:` in its configuration (config.yaml, then
config.yaml.d/*.yaml in name order, a later file replacing an earlier one), K3S_NODE_NAME
in the unit's environment, the hostname. The layer's unit drop-in makes K3S_NODE_NAME from
the hardware (`gpu-k8s-k3s-node-name`, hostname-serial or hostname-DMI-UUID) into
/run/gpu-k8s/k3s-node.env, read after /etc/default/k3s*, so it wins over a K3S_NODE_NAME
there. The gate reads that file, and runs the same script itself when k3s has not run in
this boot: one implementation of the naming, not two."""

from __future__ import annotations

import logging
import socket
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_k8s_update.system import run_command

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NamingPaths:
    config_dir: Path = Path("/etc/rancher/k3s")
    node_env: Path = Path("/run/gpu-k8s/k3s-node.env")
    default_files: tuple[Path, ...] = (Path("/etc/default/k3s"), Path("/etc/default/k3s-agent"))
    # The layer's script; absent on images without the layer's k3s config.
    naming_command: tuple[str, ...] = ("/usr/libexec/gpu-k8s/gpu-k8s-k3s-node-name",)


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value.split(" #", 1)[0].strip()


def config_node_name(config_dir: Path) -> str:
    """A top-level `node-name:` from k3s's config files, the last one k3s reads winning."""
    files = [config_dir / "config.yaml"]
    dropins = config_dir / "config.yaml.d"
    if dropins.is_dir():
        files += sorted(p for p in dropins.iterdir() if p.suffix in (".yaml", ".yml"))
    name = ""
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep and key == "node-name" and _unquote(value):
                name = _unquote(value)
    return name


def env_file_value(path: Path, key: str) -> str:
    """KEY=value from a systemd EnvironmentFile (quotes allowed, last assignment wins)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    value = ""
    for line in text.splitlines():
        name, sep, raw = line.strip().removeprefix("export ").partition("=")
        if sep and name.strip() == key:
            value = _unquote(raw)
    return value


def hardware_node_name(paths: NamingPaths) -> str:
    """What the layer's unit drop-in gave k3s in this boot, or the same script run now."""
    name = env_file_value(paths.node_env, "K3S_NODE_NAME")
    if name:
        return name
    with tempfile.TemporaryDirectory(prefix="gpu-k8s-update-") as temp:
        env_file = Path(temp) / "k3s-node.env"
        result = _run_naming(paths.naming_command, env_file)
        if result:
            log.info("node name: %s", result)
        return env_file_value(env_file, "K3S_NODE_NAME")


def _run_naming(command: Sequence[str], env_file: Path) -> str:
    # The script takes its output path from the environment; env(1) sets it without a shell.
    outcome = run_command(["env", f"GPU_K8S_NODE_ENV={env_file}", *command], timeout_s=30)
    if outcome.returncode != 0:
        log.debug("node naming script: exit %d %s", outcome.returncode, outcome.last_line)
        return ""
    return outcome.last_line


def k3s_node_name(paths: NamingPaths | None = None, hostname: str | None = None) -> tuple[str, str]:
    """The node name k3s registers, and where it came from."""
    paths = paths or NamingPaths()
    name = config_node_name(paths.config_dir)
    if name:
        return name, f"node-name in {paths.config_dir}"
    name = hardware_node_name(paths)
    if name:
        return name, "gpu-k8s-k3s-node-name (hostname and hardware id)"
    for path in paths.default_files:
        name = env_file_value(path, "K3S_NODE_NAME")
        if name:
            return name, f"K3S_NODE_NAME in {path}"
    # k3s lower-cases the hostname it registers.
    return (hostname or socket.gethostname()).lower(), "hostname"
