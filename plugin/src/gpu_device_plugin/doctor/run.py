"""All checks, in the order a GPU pod depends on them; one that cannot run never hides the others."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..config.settings import Settings
from ..core import policy
from ..discovery.tegra import OPENRM
from .config_file import config_file_check
from .csv_files import OPENRM_CSV_NODES, evaluate_csv, read_csv_files
from .dra import DraPaths, evaluate_dra
from .gpu import Discovered, device_node_problems, discover, evaluate_device_nodes, evaluate_discovery
from .host import read_text
from .k3s import K3sConfig, evaluate_k3s, read_k3s_config
from .kubelet import CHECKPOINT_NAME, evaluate_checkpoint, evaluate_kubelet_socket, evaluate_plugin_socket, probe_socket
from .nvidia_stack import check_cdi, check_datacentre, check_driver, check_jetson_toolkit
from .openrm import check_openrm_driver
from .report import SKIP, WARN, Check
from .runtime import check_container_runtime, check_isolation


def crashed(name: str, exc: Exception) -> Check:
    if isinstance(exc, OSError):
        return Check(name, WARN, f"check could not run: {exc}", "run the check as root")
    return Check(name, WARN, f"check could not run: {type(exc).__name__}: {exc}",
                 "report this as a gpu-device-plugin bug, with the output of `gpu-device-plugin discover`")


def guard(name: str, run: Callable[[], Check]) -> Check:
    # one check that cannot read what it needs must not hide the others
    try:
        return run()
    except Exception as exc:
        return crashed(name, exc)


def run_checks(settings: Settings) -> list[Check]:
    """Every check, in the order a GPU pod depends on them."""
    checks = [guard("config file", lambda: config_file_check(settings))]
    try:
        found = discover(settings)
        checks.append(evaluate_discovery(found))
    except Exception as exc:
        found = Discovered(settings.device_discovery_strategy, None, "discovery did not run",
                           resource=policy.resource_name(settings))
        checks.append(crashed("discovery", exc))
    gpu_kind = found.backend
    # Thor's iGPU runs on NVIDIA's open driver, not nvgpu: its nodes, CSV lines and driver differ
    gpu_driver = next((g.properties.get("gpu_driver", "") for g in found.gpus if g.backend == "tegra"), "")
    openrm = gpu_driver == OPENRM
    csv_nodes = (*(n for g in found.gpus for n in g.device_nodes[:1]), *OPENRM_CSV_NODES) if openrm else ()

    def nodes() -> Check:
        checked, problems = device_node_problems(settings, found.gpus)
        return evaluate_device_nodes(gpu_kind, checked, problems, gpu_driver)

    def plugin() -> Check:
        if dra_serves:
            return Check("plugin socket", SKIP, f"allocationApi is {settings.allocation_api}: the device plugin "
                         "registers nothing here (the DRA driver hands out the GPUs, below)")
        state, error = probe_socket(plugin_socket)
        return evaluate_plugin_socket(plugin_socket, state, found.advertised, error)

    dra_serves = settings.allocation_api in ("dra", "both")
    socket_dir = os.path.dirname(settings.kubelet_socket) or "/"
    plugin_socket = os.path.join(socket_dir, policy.socket_name(found.resource))
    checkpoint = os.path.join(socket_dir, CHECKPOINT_NAME)
    checks.append(guard("device nodes", nodes))
    kubelet = settings.kubelet_socket
    checks.append(guard("kubelet socket", lambda: evaluate_kubelet_socket(kubelet, *probe_socket(kubelet))))
    checks.append(guard("plugin socket", plugin))
    checks.append(guard("kubelet checkpoint",
                         lambda: evaluate_checkpoint(checkpoint, read_text(checkpoint), found.resource)))
    try:
        k3s = read_k3s_config(settings)
        checks.append(evaluate_k3s(k3s, gpu_kind))
    except Exception as exc:
        k3s = K3sConfig()
        checks.append(crashed("k3s config", exc))
    dra_paths = DraPaths.beside(settings.kubelet_socket)
    checks.append(guard("DRA driver", lambda: evaluate_dra(
        settings.allocation_api, k3s, dra_paths, probe_socket(dra_paths.registration)[0],
        probe_socket(dra_paths.dra)[0], read_text(dra_paths.checkpoint))))
    checks.append(guard("container runtime", lambda: check_container_runtime(settings, k3s, gpu_kind)))
    l4t = next((g.properties.get("l4t", "") for g in found.gpus if g.backend == "tegra"), "")
    checks.append(guard("GPU isolation", lambda: check_isolation(settings, gpu_kind, l4t)))
    checks.append(guard("runtime CSV files", lambda: evaluate_csv(gpu_kind, read_csv_files(settings), csv_nodes)))
    checks.append(guard("NVIDIA driver", lambda: check_openrm_driver(settings) if openrm
                        else check_driver(settings, gpu_kind)))
    checks.append(guard("NVIDIA CDI spec", lambda: check_cdi(settings, gpu_kind, found.gpus)))
    checks.append(guard("NVIDIA data-centre services", lambda: check_datacentre(settings, gpu_kind, found.gpus)))
    checks.append(guard("NVIDIA container toolkit", lambda: check_jetson_toolkit(settings, gpu_kind, found.gpus)))
    return checks
