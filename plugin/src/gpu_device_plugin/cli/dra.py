"""`gpu-device-plugin dra`: the DRA driver. The same discovery and health monitors as the device
plugin (one source of truth for both), then the driver's daemon until SIGTERM.

Exit status: 0 after SIGTERM, or at once when `--allocation-api device-plugin` leaves the GPUs to
the device plugin; 1 with no GPU and `--fail-on-init-error`; 2 for a setting or credential that
can never work (named in one line with its fix).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import time
from collections.abc import Mapping, Sequence

from .. import __version__
from ..config import cache
from ..config.settings import ConfigError, Settings
from ..discovery.base import DiscoveryError
from ..discovery.select import choose
from ..dra import options
from ..dra.cluster import Cluster, identity, node_of
from ..dra.daemon import DraDaemon
from ..dra.kube import ApiError, KubeClient, KubeconfigError, load_kubeconfig
from ..model import Gpu
from ..observability import sdnotify
from .serve import make_monitor

log = logging.getLogger("gpu_device_plugin")

NODE_RETRY_MAX_S = 30.0
KUBECONFIG_POLL_S = 2.0


def wait_for_kubeconfig(path: str, poll: float = KUBECONFIG_POLL_S) -> None:
    """An agent not yet joined has no kubeconfig: k3s writes it when the node joins. Wait for it (a stat
    every `poll` seconds) rather than exit and have systemd give up after five quick restarts."""
    if os.path.exists(path):
        return
    log.warning("waiting for %s: k3s writes it when this node joins its cluster (or pass --kubeconfig)", path)
    while not os.path.exists(path):
        time.sleep(poll)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for option in options.OPTIONS:
        parser.add_argument(option.flag, dest=option.attr, metavar=option.metavar, default=None,
                            help=f"{option.help} [env {option.env}]")


def resolve_node(client: KubeClient, given: str) -> str:
    """The node name: given, or the node our identity is; retried while the API server cannot be reached
    (a node boots before its server answers). ConfigError when the identity is not a node's."""
    if given:
        return given
    delay, told = 0.5, ""
    while True:
        try:
            user = identity(client)
        except ApiError as exc:
            if exc.status and exc.status not in (429, 500, 502, 503, 504):
                raise ConfigError(f"cannot ask the API server who we are ({exc}): pass --node-name") from None
            if str(exc) != told:
                log.warning("waiting for the API server to say which node we are (%s); retrying", exc)
                told = str(exc)
            time.sleep(delay)
            delay = min(delay * 2, NODE_RETRY_MAX_S)
            continue
        node = node_of(user)
        if not node:
            raise ConfigError(f"the kubeconfig's identity is {user or 'anonymous'}, not a node's "
                              "(system:node:<name>): pass --node-name")
        return node


def docker_mode_refusal(settings: Settings) -> str:
    """Why the driver must not publish on this node ("" when it may): k3s in docker mode runs pods through
    cri-dockerd, which does not pass the kubelet's CDI device names on (docs/layer.md, "GPU isolation"), so
    a claim's pod would start without its GPU and without an error."""
    from ..doctor.k3s import read_k3s_config

    k3s = read_k3s_config(settings)
    if not k3s.docker:
        return ""
    return (f"k3s runs pods through docker here (docker: true in {k3s.docker_from}), and its cri-dockerd does not "
            "pass a claim's CDI devices to containers: they would start without their GPU. Switch the node to "
            "k3s's containerd (GPU_K8S_K3S_RUNTIME = \"containerd\", docs/layer.md) or keep "
            "allocationApi: device-plugin")


def discover(settings: Settings) -> tuple[str, list[Gpu], str]:
    """(backend name, GPUs, why there are none)."""
    choice = choose(settings)
    log.info("discovery: %s", choice.reason)
    if choice.backend is None:
        return "", [], "no GPU on this node"
    try:
        return choice.backend.name, choice.backend.discover(), ""
    except DiscoveryError as exc:
        return choice.backend.name, [], str(exc)


def run(settings: Settings, namespace: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        dra = options.parse(namespace, environ)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    log.info("gpu-device-plugin %s DRA driver %s starting (discovery: %s)", __version__, dra.driver_name,
             settings.device_discovery_strategy)
    if settings.allocation_api == "device-plugin":
        log.warning("--allocation-api is device-plugin: this node's GPUs go to pods through the device plugin "
                    "(nvidia.com/gpu); the DRA driver publishes nothing. Set allocationApi: dra or both in the "
                    "config file to use it")
        # a Type=notify unit that exits before READY=1 would count as failed
        sdnotify.notify("READY=1\nSTATUS=not publishing: the device plugin serves this node's GPUs", dict(environ))
        return 0
    refusal = docker_mode_refusal(settings)
    if refusal:
        log.error("%s", refusal)
        return 2
    backend, gpus, why = discover(settings)
    if not gpus:
        if settings.fail_on_init_error:
            log.error("%s; exiting because --fail-on-init-error is true", why or "discovery found no GPU")
            return 1
        log.warning("%s; publishing no device (set --fail-on-init-error=true to exit instead)",
                    why or "discovery found no GPU")
    for gpu in gpus:
        log.info("discovered GPU %d: %s (%s)", gpu.index, gpu.name, gpu.id)
    wait_for_kubeconfig(dra.kubeconfig)
    try:
        client = KubeClient(load_kubeconfig(dra.kubeconfig, cache.cache_dir(environ)), dra.api_timeout)
        node = resolve_node(client, dra.node_name)
    except (KubeconfigError, ConfigError) as exc:
        log.error("%s", exc)
        return 2

    def rediscover() -> list[Gpu] | None:
        try:
            return choose(settings).backend.discover() if backend else None  # type: ignore[union-attr]
        except DiscoveryError as exc:
            log.warning("discovering the GPUs again failed: %s", exc)
            return None

    def monitor(found: Sequence[Gpu]):
        return make_monitor(settings, backend) if backend else None

    gc.freeze()
    return DraDaemon(settings, dra, node, Cluster(client, node, dra.driver_name), gpus, monitor,
                     rediscover if backend else None, environ=environ).run()
