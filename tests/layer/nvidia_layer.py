"""The NVIDIA class's python helpers (classes/gpu_k8s_nvidia.bbclass), run in tests with a
stand-in for bitbake's `d` and `bb`: the knob's default per machine and series, and the
one-line reasons a build with the NVIDIA stack cannot go on."""

from __future__ import annotations

import re
import textwrap
from types import SimpleNamespace

from bbfile import parse
from layer_paths import LAYER

NVIDIA_CLASS = LAYER / "classes/gpu_k8s_nvidia.bbclass"
VERSION_INC = LAYER / "recipes-graphics/nvidia-driver/nvidia-driver-version.inc"


def _vercmp_string_op(a: str, b: str, op: str) -> bool:
    key_a, key_b = [int(x) for x in a.split(".")], [int(x) for x in b.split(".")]
    return {"<": key_a < key_b, ">=": key_a >= key_b}[op]


def class_functions() -> dict:
    source = NVIDIA_CLASS.read_text()
    blocks = re.findall(r"^def .*?(?=^\S)", source + "\nEND\n", re.S | re.M)
    namespace: dict = {"bb": SimpleNamespace(utils=SimpleNamespace(vercmp_string_op=_vercmp_string_op))}
    exec("\n".join(textwrap.dedent(block) for block in blocks), namespace)
    return namespace


class Data:
    """The variables the class reads, as bitbake would give them (genericx86-64, wrynose,
    GPU_K8S_NVIDIA = "1", no Fabric Manager, no licence accepted, unless told otherwise)."""

    def __init__(self, **values: str) -> None:
        own = parse(NVIDIA_CLASS)
        defaults = {"GPU_K8S_NVIDIA_MIN_GO": own.value("GPU_K8S_NVIDIA_MIN_GO"),
                    "GPU_K8S_NVIDIA_LICENSE_FLAG": own.value("GPU_K8S_NVIDIA_LICENSE_FLAG"),
                    "TARGET_ARCH": "x86_64", "MACHINEOVERRIDES": "x86-64:genericx86-64", "GPU_K8S_NVIDIA": "1",
                    "GPU_K8S_NVIDIA_FABRICMANAGER": "0",
                    "NVIDIA_DRIVER_VERSION": parse(VERSION_INC).value("NVIDIA_DRIVER_VERSION"),
                    "DISTRO_FEATURES": "systemd virtualization seccomp k3s gpu-k8s"}
        self.values = {**defaults, **values}

    def getVar(self, name: str) -> str | None:
        return self.values.get(name)


def nvidia_default(overrides: tuple[str, ...]) -> str:
    """GPU_K8S_NVIDIA's default for a machine on wrynose (no GOVERSION)."""
    arch = "aarch64" if "tegra" in overrides else "x86_64"
    data = Data(TARGET_ARCH=arch, MACHINEOVERRIDES=":".join(overrides))
    return class_functions()["gpu_k8s_nvidia_default"](data)
