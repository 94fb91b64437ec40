"""Which of the plugin's hand-overs reaches a container through the node's NVIDIA runtime.

The runtime takes a GPU request from an unprivileged container only by the channels its
configuration accepts (toolkit 1.19/1.20, internal/config/image/cuda_image.go VisibleDevices):
a volume mount of /dev/null under /var/run/nvidia-container-devices when
accept-nvidia-visible-devices-as-volume-mounts is true, NVIDIA_VISIBLE_DEVICES when
accept-nvidia-visible-devices-envvar-when-unprivileged is true (the toolkit's default), CDI
names whatever these say. A hand-over the runtime ignores starts GPU pods without their GPU,
so the plugin chooses one it honours ("auto", the built-in default) or refuses to start on
one it ignores. The Nano's runtime (3.1.0 with toolkit 1.0.5's hook) reads only the variable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..config.settings import DEVICE_LIST_AUTO, ConfigError, Settings
from ..model import Gpu
from . import toolkit_config

RUNTIME_BACKENDS = ("nvml", "tegra")  # GPUs that reach pods through the NVIDIA runtime
FIX = (f"set {toolkit_config.VOLUME_MOUNTS_KEY} = true in {toolkit_config.CONFIG} (the image does), or leave "
       "deviceListStrategy out of the plugin's config so the plugin takes the hand-over the runtime honours")


class HandoverChoice(NamedTuple):
    strategies: tuple[str, ...]  # what the plugin hands GPUs over as; () when none reaches the runtime
    why: str  # what decided it, or why nothing reaches


def legacy_runtime(backend: str | None, l4t: str) -> bool:
    """The Nano (L4T R32): nvidia-container-runtime 3.1.0, which reads NVIDIA_VISIBLE_DEVICES and nothing else."""
    return backend == "tegra" and l4t.startswith("R32")


def reaching(strategies: Sequence[str], config: toolkit_config.RuntimeConfig, legacy: bool = False) -> list[str]:
    """The strategies whose request the runtime takes from an unprivileged container."""
    if legacy:
        return [s for s in strategies if s == "envvar"]
    accepts = {"volume-mounts": config.accept_volume_mounts, "envvar": config.accept_envvar_unprivileged}
    # CDI names are resolved by the engine or the runtime whatever these settings say
    return [s for s in strategies if accepts.get(s, s.startswith("cdi-"))]


def choose(strategies: Sequence[str], backend: str | None, l4t: str,
           config: toolkit_config.RuntimeConfig) -> HandoverChoice:
    """The hand-over for GPUs of `backend` under this runtime configuration (pure)."""
    wanted = tuple(strategies)
    auto = wanted == (DEVICE_LIST_AUTO,)
    if backend not in RUNTIME_BACKENDS:
        # simulated GPUs (or none): no NVIDIA runtime reads the answer
        return HandoverChoice(("envvar",) if auto else wanted, "no NVIDIA runtime involved")
    if legacy_runtime(backend, l4t):
        if auto or reaching(wanted, config, legacy=True):
            return HandoverChoice(("envvar",) if auto else wanted,
                                  f"L4T {l4t}: the runtime reads NVIDIA_VISIBLE_DEVICES only")
        return HandoverChoice((), f"deviceListStrategy {','.join(wanted)}: on L4T {l4t} the NVIDIA runtime (3.1.0) "
                                  "reads NVIDIA_VISIBLE_DEVICES only, so GPU pods would start without their GPU; use "
                                  "envvar (or leave deviceListStrategy out)")
    if config.error:
        return HandoverChoice((), f"{toolkit_config.CONFIG} does not load ({config.error}): the NVIDIA runtime fails "
                                  f"every container; correct {toolkit_config.CONFIG}")
    if not auto:
        if reaching(wanted, config):
            return HandoverChoice(wanted, "set in the plugin's configuration")
        return HandoverChoice((), f"deviceListStrategy {','.join(wanted)}: {ignored(config)}, so GPU pods would "
                                  f"start without their GPU; {FIX}")
    source = toolkit_config.CONFIG if config.present else f"the toolkit's defaults (no {toolkit_config.CONFIG})"
    if config.accept_volume_mounts:
        return HandoverChoice(("volume-mounts",), f"{source} accepts volume-mount requests")
    if config.accept_envvar_unprivileged:
        return HandoverChoice(("envvar",), f"{source} accepts NVIDIA_VISIBLE_DEVICES from any container")
    return HandoverChoice((), f"{source} accepts neither volume-mount requests nor NVIDIA_VISIBLE_DEVICES from "
                              f"unprivileged containers, so no hand-over reaches a GPU pod; {FIX}")


def ignored(config: toolkit_config.RuntimeConfig) -> str:
    refused = []
    if not config.accept_volume_mounts:
        refused.append("volume-mount requests")
    if not config.accept_envvar_unprivileged:
        refused.append("NVIDIA_VISIBLE_DEVICES from unprivileged containers")
    where = toolkit_config.CONFIG if config.present else f"the toolkit's defaults (no {toolkit_config.CONFIG})"
    return f"the NVIDIA runtime ignores {' and '.join(refused)} ({where})"


def for_gpus(settings: Settings, gpus: Sequence[Gpu]) -> HandoverChoice:
    """`choose` for the GPUs being served, reading the runtime's configuration under the host root."""
    backend = gpus[0].backend if gpus else None
    l4t = next((g.properties.get("l4t", "") for g in gpus if g.backend == "tegra"), "")
    config = toolkit_config.read(settings.host_root) if backend in RUNTIME_BACKENDS else toolkit_config.RuntimeConfig()
    return choose(settings.device_list_strategy, backend, l4t, config)


def resolve(settings: Settings, gpus: Sequence[Gpu]) -> Settings:
    """The settings with the hand-over decided; ConfigError naming the fix when none reaches the runtime."""
    choice = for_gpus(settings, gpus)
    if not choice.strategies:
        raise ConfigError(choice.why)
    return settings if choice.strategies == settings.device_list_strategy else \
        settings._replace(device_list_strategy=choice.strategies)
