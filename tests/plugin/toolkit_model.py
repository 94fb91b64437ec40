"""What the NVIDIA container runtime does with a container's GPU request, for the isolation tests.

A model, written from the toolkit's sources at the tags the images ship (1.19.1 on Orin, 1.20.0
on x86-64; these files are the same in both): the config is the file's TOML merged over the
defaults (api/config/v1 toml.go, go-toml Unmarshal into GetDefault's struct); the request is
annotations, then volume mounts of /dev/null under /var/run/nvidia-container-devices when
accepted, then NVIDIA_VISIBLE_DEVICES only from a privileged container (CAP_SYS_ADMIN in the
bounding set) or when the config accepts it (internal/config/image cuda_image.go VisibleDevices,
devices.go, privileged.go). A container with a request also gets every device of each feature
whose variable says "enabled" (NVIDIA_GDS, _MOFED, _GDRCOPY, _NVSWITCH: internal/modifier/cdi.go
gatedDevices, in jit-cdi, csv and legacy modes; not in pure cdi mode), privileged or not. The
environment is a map where the last entry of a name wins (builder.go WithEnv); the kubelet lists
the device plugin's variables, then the pod's envFrom and env (kubelet_pods.go
GenerateRunContainerOptions), and docker and containerd put the image's ENV first, so the pod's
own value beats the plugin's, which beats the image's. The Nano's hook (toolkit 1.0.5,
container_config.go) reads the variable alone. The request cases were run once against the
runtimes built from those tags (the review of issue 37); the feature cases run in
test_toolkit_runtime.py against nvidia-container-runtime built there from both tags (jit-cdi with
the x86-64 image's configuration, CSV with the Orin's), which also checks this model's answers.
"""

from __future__ import annotations

import posixpath
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

FIXTURES = Path(__file__).parent / "fixtures" / "toolkit"
DEFAULTS_1_20 = FIXTURES / "config-default-1.20.0.toml"
VOLUME_ROOT = "/var/run/nvidia-container-devices"
CUDA_IMAGE_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
                  "CUDA_VERSION": "13.0.1", "NVIDIA_REQUIRE_CUDA": "cuda>=13.0"}  # what nvidia/cuda images set


def merge(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Tables merge key by key; any other value (lists included) is replaced, as go-toml does."""
    out = dict(defaults)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def defaults_of(path: Path = DEFAULTS_1_20) -> dict[str, Any]:
    """The defaults `nvidia-ctk config default` printed. It writes a key whose value is the default of
    a commented-out key (toml.go commentDefaults), e.g. "#accept-nvidia-visible-devices-envvar-when-
    unprivileged = true": those lines are defaults too (GetDefault), so they are read uncommented."""
    text = re.sub(r"(?m)^#([A-Za-z0-9_.-]+ = .*)$", r"\1", path.read_text())
    return tomllib.loads(text)


def effective_config(text: str, defaults: Path = DEFAULTS_1_20) -> dict[str, Any]:
    return merge(defaults_of(defaults), tomllib.loads(text))


@dataclass(frozen=True)
class Container:
    """What the runtime sees in the OCI spec."""

    env: Mapping[str, str]
    mounts: Sequence[tuple[str, str]] = ()  # (host source, container destination)
    privileged: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)


def container(image_env: Mapping[str, str], pod_env: Mapping[str, str] | None = None,
              allocation: Any = None, privileged: bool = False,
              volumes: Sequence[tuple[str, str]] = ()) -> Container:
    """The container the engine creates: image ENV, then the device plugin's envs, then the pod's envFrom
    and env (later wins), the plugin's mounts and the pod's own volumes."""
    env = dict(image_env)
    mounts = list(volumes)
    annotations: dict[str, str] = {}
    if allocation is not None:
        env.update(allocation.envs)
        mounts += [(host, path) for path, host, _ in allocation.mounts]
        annotations.update(allocation.annotations)
    env.update(pod_env or {})
    return Container(env, mounts, privileged, annotations)


def _env_devices(env: Mapping[str, str]) -> list[str]:
    value = env.get("NVIDIA_VISIBLE_DEVICES")
    if value is None:
        # a legacy CUDA image (CUDA_VERSION without NVIDIA_REQUIRE_CUDA) means "all"
        legacy = env.get("CUDA_VERSION") and not env.get("NVIDIA_REQUIRE_CUDA")
        return ["all"] if legacy else []
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items or "void" in items:
        return []
    if "all" in items:
        return ["all"]
    if "none" in items:
        return [""]
    return items


def requested(c: Container, config: Mapping[str, Any]) -> list[str]:
    """The device names the runtime acts on (toolkit 1.19.1/1.20.0)."""
    prefixes = config["nvidia-container-runtime"]["modes"]["cdi"].get("annotation-prefixes", [])
    from_annotations = [name for key in sorted(c.annotations) if any(key.startswith(p) for p in prefixes)
                        for name in c.annotations[key].split(",")]
    if from_annotations:
        return from_annotations
    if config.get("accept-nvidia-visible-devices-as-volume-mounts", False):
        seen: list[str] = []
        for source, destination in c.mounts:
            path = posixpath.normpath(destination)
            if posixpath.normpath(source) != "/dev/null" or not path.startswith(VOLUME_ROOT):
                continue
            name = path[len(VOLUME_ROOT):].strip("/")
            if name and not name.startswith("imex/") and name not in seen:
                seen.append(name[len("cdi/"):] if name.startswith("cdi/") else name)
        if seen:
            return seen
    devices = _env_devices(c.env)
    if c.privileged or config.get("accept-nvidia-visible-devices-envvar-when-unprivileged", True):
        return devices
    return []


# variable -> the host devices the toolkit adds for it (internal/discover: gds.go, mofed.go, gdrcopy.go, nvswitch.go)
FEATURES = {"NVIDIA_GDS": "/dev/nvidia-fs*", "NVIDIA_MOFED": "/dev/infiniband/uverbs*",
            "NVIDIA_GDRCOPY": "/dev/gdrdrv", "NVIDIA_NVSWITCH": "/dev/nvidia-nvswitch*"}


def feature_devices(c: Container, config: Mapping[str, Any], mode: str = "") -> set[str]:
    """The feature devices the runtime adds to the container: every one whose variable is "enabled", when the
    container has any device request and the mode is not pure cdi (mode: the one `auto` resolved to)."""
    mode = mode or config["nvidia-container-runtime"]["mode"]
    if mode == "cdi" or not requested(c, config):
        return set()
    return {devices for name, devices in FEATURES.items() if c.env.get(name) == "enabled"}


def granted(names: Sequence[str], gpus: Sequence[tuple[int, str]]) -> set[str]:
    """The GPU UUIDs the names select, as the spec (or the spec built per container) names them:
    index, UUID, "all"; `gpus` are (index, uuid)."""
    out: set[str] = set()
    for name in names:
        name = name.rsplit("=", 1)[-1]  # a qualified CDI name: its device part
        for index, uuid in gpus:
            if name in ("all", str(index), uuid):
                out.add(uuid)
    return out


def nano_requested(c: Container) -> list[str]:
    """Toolkit 1.0.5's hook (the Nano): NVIDIA_VISIBLE_DEVICES from any container, nothing else."""
    return _env_devices(c.env)
