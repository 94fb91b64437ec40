"""The DRA driver's flags, each with its environment variable: parsed into DraSettings, a bad value
refused with a message naming the flag and the fix. Pure: a namespace and an environment in."""

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..config.settings import ConfigError
from .settings import MULTIPLE_ALLOCATIONS, TAINT_EFFECTS, DraSettings

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def _abs_path(text: str) -> str:
    value = text.strip()
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, got {text!r}")
    return value.rstrip("/") or "/"


def _optional_abs_path(text: str) -> str:
    return "" if not text.strip() else _abs_path(text)


def driver_name(text: str) -> str:
    """A DRA driver name: a DNS subdomain of at most 63 characters (resource.k8s.io's rule), ending in a
    domain its owner holds; NVIDIA's own name is refused, so two drivers never publish the same GPUs
    under one name."""
    value = text.strip()
    if len(value) > 63 or "." not in value or not all(re.fullmatch(_DNS_LABEL, part) for part in value.split(".")):
        raise ValueError(f"must be a lowercase DNS subdomain of at most 63 characters with a dot, e.g. "
                         f"gpu.meta-gpu-k8s.io; got {text!r}")
    if value == "gpu.nvidia.com":
        raise ValueError("gpu.nvidia.com is NVIDIA's DRA driver's name: pick a domain of your own "
                         "(the default is gpu.meta-gpu-k8s.io)")
    return value


def node_name(text: str) -> str:
    value = text.strip()
    if value and (len(value) > 253 or not all(re.fullmatch(_DNS_LABEL, part) for part in value.split("."))):
        raise ValueError(f"must be a Kubernetes node name (lowercase DNS subdomain), got {text!r}")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}; got {text!r}")
        return text.strip()

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("s"))
    except ValueError:
        raise ValueError(f"must be seconds, e.g. 10 or 2.5s; got {text!r}") from None
    if not 0.1 <= value <= 600:
        raise ValueError(f"must be 0.1..600 seconds, got {value:g}")
    return value


class DraOption(NamedTuple):
    attr: str
    flag: str
    env: str
    parse: Callable[[str], Any]
    help: str
    metavar: str


OPTIONS: tuple[DraOption, ...] = (
    DraOption("kubeconfig", "--kubeconfig", "KUBECONFIG", _abs_path,
              "kubeconfig of the node's identity (k3s: the kubelet's own, a system:node:<name> client certificate)",
              "PATH"),
    DraOption("node_name", "--node-name", "NODE_NAME", node_name,
              "this node's name (default: the node the kubeconfig's identity is, system:node:<name>)", "NAME"),
    DraOption("driver_name", "--driver-name", "DRA_DRIVER_NAME", driver_name,
              "DRA driver name: the ResourceSlices' driver and the attribute domain", "NAME"),
    DraOption("plugins_registry_dir", "--plugins-registry-dir", "KUBELET_REGISTRAR_DIR", _abs_path,
              "the kubelet's plugin watcher directory; the registration socket goes here", "DIR"),
    DraOption("kubelet_plugins_dir", "--kubelet-plugins-dir", "KUBELET_PLUGINS_DIR", _abs_path,
              "the kubelet's plugins directory: the DRA socket goes in <this>/<driver name>/ unless --plugin-dir",
              "DIR"),
    DraOption("plugin_dir", "--plugin-dir", "DRA_PLUGIN_DIR", _optional_abs_path,
              "directory of the DRA socket (default <--kubelet-plugins-dir>/<driver name>)", "DIR"),
    DraOption("cdi_dir", "--cdi-dir", "CDI_DIR", _abs_path,
              "where the per-claim CDI specs are written (the container runtime's CDI directory)", "DIR"),
    DraOption("state_dir", "--state-dir", "DRA_STATE_DIR", _optional_abs_path,
              "where the checkpoint of prepared claims is kept (default: the plugin dir)", "DIR"),
    DraOption("multiple_allocations", "--multiple-allocations", "DRA_MULTIPLE_ALLOCATIONS",
              _choice(MULTIPLE_ALLOCATIONS),
              "let several claims share a GPU by its memory capacity (allowMultipleAllocations): "
              "on, off, or auto (integrated Jetson GPUs only)", "MODE"),
    DraOption("unhealthy_taint_effect", "--unhealthy-taint-effect", "DRA_UNHEALTHY_TAINT_EFFECT",
              _choice(TAINT_EFFECTS), "effect of the device taint on an unhealthy GPU: NoSchedule, NoExecute or None",
              "EFFECT"),
    DraOption("api_timeout", "--api-timeout", "DRA_API_TIMEOUT", _seconds,
              "seconds an API server call may take", "SECONDS"),
)


def parse(namespace: Any, environ: Mapping[str, str]) -> DraSettings:
    """Flags over environment over defaults; ConfigError naming the flag (or variable) and the fix."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw = getattr(namespace, option.attr, None)
        where = option.flag
        if raw is None:
            raw, where = environ.get(option.env) or None, f"environment {option.env}"
        if raw is None:
            continue
        try:
            values[option.attr] = option.parse(str(raw))
        except ValueError as exc:
            raise ConfigError(f"{where} {exc}") from None
    return DraSettings()._replace(**values)
