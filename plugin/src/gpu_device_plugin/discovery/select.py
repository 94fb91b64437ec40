"""Pick the discovery backend for a strategy, and say why in one line."""

from typing import NamedTuple

from ..config.settings import Settings
from .base import Backend, Probe
from .simulated import SimulatedBackend
from .tegra import TegraBackend


class Choice(NamedTuple):
    backend: Backend | None  # None: no GPU on this machine
    reason: str
    probes: tuple[tuple[str, Probe], ...] = ()


def _nvml(settings: Settings) -> Backend:
    from .nvml import NvmlBackend  # lazy: pynvml is optional and absent on Jetson images

    return NvmlBackend(root=settings.host_root)


def choose(settings: Settings) -> Choice:
    strategy = settings.device_discovery_strategy
    if strategy == "simulated":
        backend: Backend = SimulatedBackend(settings.simulated_gpus)
        return Choice(backend, f"simulated: {backend.probe().reason}")
    if strategy == "tegra":
        return Choice(TegraBackend(settings.host_root), "tegra: chosen by --device-discovery-strategy")
    if strategy == "nvml":
        return Choice(_nvml(settings), "nvml: chosen by --device-discovery-strategy")
    # auto: a discrete GPU NVML can see wins (the nvml probe is not usable when NVML shows only an
    # integrated GPU, as on Orin/Thor); otherwise a Jetson is served by tegra. Thor's driver does
    # answer NVML, but the container toolkit classes "NVIDIA Thor" as integrated and hands it to
    # containers in CSV mode (go-nvlib's IsIntegratedGPUName), so tegra serves it the same way.
    tegra = TegraBackend(settings.host_root)
    tegra_probe = tegra.probe()
    nvml = _nvml(settings)
    nvml_probe = nvml.probe()
    probes = (("tegra", tegra_probe), ("nvml", nvml_probe))
    if nvml_probe.usable:
        return Choice(nvml, f"auto chose nvml: {nvml_probe.reason} (tegra: {tegra_probe.reason})", probes)
    if tegra_probe.usable:
        return Choice(tegra, f"auto chose tegra: {tegra_probe.reason} (nvml: {nvml_probe.reason})", probes)
    return Choice(None, f"no GPU found: tegra: {tegra_probe.reason}; nvml: {nvml_probe.reason}", probes)
