"""Serving: discover the GPUs, choose their health monitor, and run the daemon until SIGTERM.

`gpu-device-plugin` with no command (what the systemd unit runs) and `gpu-device-plugin serve`.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence

from .. import __version__
from ..config import loader
from ..config.settings import ConfigError, Settings
from ..core import policy
from ..discovery.base import DiscoveryError
from ..discovery.select import choose
from ..health.base import HealthMonitor
from ..model import Gpu
from ..session.daemon import Daemon

log = logging.getLogger("gpu_device_plugin")


def make_monitor(settings: Settings, backend_name: str) -> HealthMonitor | None:
    if backend_name == "simulated":
        if not settings.simulated_health_dir:
            return None
        from ..health.simulated import SimulatedHealthMonitor

        return SimulatedHealthMonitor(settings.simulated_health_dir)
    if backend_name == "tegra":
        from ..health.tegra import TegraHealthMonitor

        return TegraHealthMonitor(root=settings.host_root, recovery_quiet_period_s=settings.health_recovery_period)
    if backend_name == "nvml":
        from ..health.nvml import NvmlHealthMonitor

        return NvmlHealthMonitor(recovery_quiet_period_s=settings.health_recovery_period, root=settings.host_root)
    return None


def _gpus_for_metrics(settings: Settings) -> list[Gpu]:
    """The node's GPUs for /metrics alone, on a node whose GPUs the DRA driver hands out (their pods
    are labelled from the claims PodResources lists); none when discovery fails."""
    choice = choose(settings)
    if choice.backend is None:
        return []
    try:
        return choice.backend.discover()
    except DiscoveryError as exc:
        log.warning("no GPU telemetry: %s", exc)
        return []


def serve(settings: Settings, load: Callable[[], tuple[Settings, Sequence[str]]]) -> int:
    """Discover, pick the health monitor, run the daemon until SIGTERM; `load` reads the settings anew."""
    log.info("gpu-device-plugin %s starting (discovery: %s)", __version__, settings.device_discovery_strategy)
    if settings.allocation_api in ("dra", "both"):
        # one API per GPU: the DRA driver publishes them (docs/dra.md), so nvidia.com/gpu is not registered
        log.warning("--allocation-api is %s: this node's GPUs go to pods through the DRA driver "
                    "(gpu-device-plugin dra); registering nothing as %s", settings.allocation_api,
                    policy.resource_name(settings))
        metered = _gpus_for_metrics(settings) if settings.metrics_address else []
        gc.freeze()
        return Daemon(settings, [], None, reload_settings=lambda: load()[0], metered_gpus=metered).run()
    choice = choose(settings)
    log.info("discovery: %s", choice.reason)
    gpus: list[Gpu] = []
    if choice.backend is None:
        message = "no GPU on this node"
    else:
        try:
            gpus = choice.backend.discover()
            message = ""
        except DiscoveryError as exc:
            message = str(exc)
    if not message and not policy.advertised_devices(gpus, settings):
        message = (f"discovery found {len(gpus)} GPU(s) but none can be handed out whole "
                   "(MIG-enabled or unreadable)" if gpus else "discovery found no GPU")
    if message:
        if settings.fail_on_init_error:
            log.error("%s; exiting because --fail-on-init-error is true", message)
            return 1
        log.warning("%s; running with no devices (set --fail-on-init-error=true to exit instead)", message)
    for gpu in gpus:
        log.info("discovered GPU %d: %s (%s) nodes=%s", gpu.index, gpu.name, gpu.id,
                 ",".join(gpu.device_nodes) or "-")
    conflict = loader.backend_conflict(settings, choice.backend.name) if gpus and choice.backend else None
    if conflict:
        log.error("%s", conflict)
        return 2
    monitor = make_monitor(settings, choice.backend.name) if gpus and choice.backend else None

    def reload() -> Settings:
        new, warnings = load()
        for warning in warnings:
            log.warning("%s", warning)
        return new

    try:
        daemon = Daemon(settings, gpus, monitor, reload_settings=reload)
    except ConfigError as exc:
        # a hand-over the NVIDIA runtime ignores would start every GPU pod without its GPU
        log.error("%s", exc)
        return 2
    if daemon.settings.device_list_strategy != settings.device_list_strategy:
        log.info("GPUs are handed over as %s: the hand-over the NVIDIA runtime on this node honours",
                 ",".join(daemon.settings.device_list_strategy))
    # Everything imported so far lives as long as the process: keep it out of the cyclic garbage
    # collector, so a full collection during an Allocate walks a few objects, not ~25 000.
    gc.freeze()
    return daemon.run()

