"""A claim's (or its class's) opaque configuration for our driver: `GpuConfig` in the driver's API group,
shaped like NVIDIA's (`sharing.strategy: TimeSlicing`, `timeSlicingConfig.interval`), so a claim
written for theirs needs only its apiVersion changed. Pure: parameters in, a GpuConfig or a
ConfigRefused naming the field out.

```yaml
config:
- opaque:
    driver: gpu.meta-gpu-k8s.io
    parameters:
      apiVersion: gpu.meta-gpu-k8s.io/v1alpha1
      kind: GpuConfig
      sharing:
        strategy: TimeSlicing
        timeSlicingConfig: {interval: Long}
```

Sharing itself is by claim: every pod that names the claim gets the same prepared GPU. The interval
is set on a discrete GPU with nvidia-smi (compute mode DEFAULT, `compute-policy --set-timeslice`);
a Jetson's GPU time-slices its channels on the driver's own schedule, so only `Default` is
accepted there. MPS is not carried (refused with the reason).
"""

from collections.abc import Mapping
from typing import Any, NamedTuple

API_VERSION_SUFFIX = "/v1alpha1"
KIND = "GpuConfig"
TIME_SLICING = "TimeSlicing"
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}  # nvidia-smi compute-policy's values


class ConfigRefused(ValueError):
    """A configuration for our driver that it cannot apply; the message names the field."""


class GpuConfig(NamedTuple):
    strategy: str = ""  # "" = no sharing settings: the GPU as the driver left it
    interval: str = "Default"


def api_version(driver: str) -> str:
    return driver + API_VERSION_SUFFIX


def parse(parameters: Any, driver: str, where: str) -> GpuConfig:
    """One opaque configuration's parameters. `where` names it in messages (e.g. "claim config[0]")."""
    if not isinstance(parameters, Mapping):
        raise ConfigRefused(f"{where}: parameters must be an object with apiVersion {api_version(driver)} "
                            f"and kind {KIND}")
    if parameters.get("apiVersion") != api_version(driver) or parameters.get("kind") != KIND:
        raise ConfigRefused(f"{where}: apiVersion/kind must be {api_version(driver)}/{KIND}, got "
                            f"{parameters.get('apiVersion')!r}/{parameters.get('kind')!r}")
    unknown = sorted(set(parameters) - {"apiVersion", "kind", "sharing"})
    if unknown:
        raise ConfigRefused(f"{where}: unknown field(s) {', '.join(unknown)}; {KIND} has only sharing")
    sharing = parameters.get("sharing")
    if sharing is None:
        return GpuConfig()
    if not isinstance(sharing, Mapping):
        raise ConfigRefused(f"{where}: sharing must be an object such as {{strategy: {TIME_SLICING}}}")
    strategy = sharing.get("strategy")
    if strategy == "MPS":
        raise ConfigRefused(f"{where}: sharing.strategy MPS is not carried by this driver (no MPS control daemon "
                            f"on these images); use {TIME_SLICING}, or share the claim between pods")
    if strategy != TIME_SLICING:
        raise ConfigRefused(f"{where}: sharing.strategy must be {TIME_SLICING}, got {strategy!r}")
    unknown = sorted(set(sharing) - {"strategy", "timeSlicingConfig"})
    if unknown:
        raise ConfigRefused(f"{where}: unknown field(s) sharing.{', sharing.'.join(unknown)}")
    slicing = sharing.get("timeSlicingConfig") or {}
    if not isinstance(slicing, Mapping) or set(slicing) - {"interval"}:
        raise ConfigRefused(f"{where}: sharing.timeSlicingConfig takes only interval")
    interval = slicing.get("interval", "Default")
    if interval not in INTERVALS:
        raise ConfigRefused(f"{where}: sharing.timeSlicingConfig.interval must be one of {', '.join(INTERVALS)}, "
                            f"got {interval!r}")
    return GpuConfig(TIME_SLICING, interval)


def refusal_for(config: GpuConfig, backend: str, device: str) -> str:
    """Why `config` cannot be applied to a GPU of `backend` ("" when it can)."""
    if config.strategy == TIME_SLICING and config.interval != "Default" and backend != "nvml":
        return (f"{device}: timeSlicingConfig.interval {config.interval} cannot be set on a Jetson's GPU (its "
                "driver time-slices channels on its own schedule); use Default or leave the interval out")
    return ""


def time_slice_commands(config: GpuConfig, uuid: str) -> list[list[str]]:
    """The nvidia-smi calls that apply `config` to a discrete GPU (none for no sharing settings)."""
    if config.strategy != TIME_SLICING:
        return []
    return [["nvidia-smi", "-i", uuid, "-c", "DEFAULT"],
            ["nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", str(INTERVALS[config.interval])]]
