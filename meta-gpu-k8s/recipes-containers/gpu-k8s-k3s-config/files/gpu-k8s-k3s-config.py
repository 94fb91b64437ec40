#!/usr/bin/env python3
"""Render the image's k3s configuration drop-ins (/etc/rancher/k3s/config.yaml.d/*.yaml).

Run by gpu-k8s-k3s-config's do_install with the recipe's knobs, and by the layer tests
with the same knobs, so the tests read exactly the files an image gets. Standard library
only (python3-native). config.yaml itself is left to provisioning.

k3s reads config.yaml, then config.yaml.d/*.yaml in name order; a later file replaces a
key, except keys written "key+:" whose lists are appended. Every list here is appended,
so provisioning's own kubelet-arg/node-label entries survive.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

RUNTIMES = ("docker", "containerd")
ROLES = ("server", "agent")
CGROUP_DRIVERS = ("cgroupfs", "systemd")
KUBELET_PROFILES = ("default", "small-4gb")
# The node label the fleet rollout selects by: one Plan pair per device type.
DEVICE_TYPE_LABEL = "update.gpu-k8s.io/device-type"
# A label value (63 at most) that also fits in a Plan name (the rollout's limit is 45).
DEVICE_TYPE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,43}[a-z0-9])?$")

# A 4 GB Jetson Nano: the GPU takes its memory from the same 4 GB, so the kubelet keeps
# room for the OS (systemd, docker, sshd) and for k3s itself, evicts pods before the
# kernel's OOM killer has to act, and collects unused images before the SD card fills.
SMALL_4GB_KUBELET_ARGS = (
    "system-reserved=cpu=250m,memory=384Mi,ephemeral-storage=1Gi",
    "kube-reserved=cpu=250m,memory=384Mi,ephemeral-storage=1Gi",
    "eviction-hard=memory.available<300Mi,nodefs.available<10%,imagefs.available<10%,nodefs.inodesFree<5%",
    "eviction-soft=memory.available<500Mi,nodefs.available<15%,imagefs.available<15%",
    "eviction-soft-grace-period=memory.available=1m,nodefs.available=2m,imagefs.available=2m",
    "eviction-max-pod-grace-period=30",
    "image-gc-high-threshold=75",
    "image-gc-low-threshold=60",
)


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Knobs:
    role: str = "server"
    runtime: str = "docker"
    cgroup_driver: str = "systemd"
    cgroup_v1: bool = False
    nvidia_runtime: bool = False
    kubelet_profile: str = "default"
    disable: tuple[str, ...] = ()
    disable_network_policy: bool = False
    pause_image: str = ""
    node_labels: tuple[str, ...] = field(default_factory=tuple)
    device_type: str = ""

    def validate(self) -> None:
        for name, value, allowed in (
            ("role", self.role, ROLES),
            ("runtime", self.runtime, RUNTIMES),
            ("cgroup driver", self.cgroup_driver, CGROUP_DRIVERS),
            ("kubelet profile", self.kubelet_profile, KUBELET_PROFILES),
        ):
            if value not in allowed:
                raise ConfigError(f"k3s {name} must be one of {', '.join(allowed)}, got {value!r}")
        if self.cgroup_v1 and self.cgroup_driver != "cgroupfs":
            raise ConfigError("cgroup v1 needs the cgroupfs driver here (systemd 250 on v1 is hybrid); "
                              "set GPU_K8S_CGROUP_DRIVER = \"cgroupfs\"")
        if self.device_type and not DEVICE_TYPE.match(self.device_type):
            raise ConfigError(f"update device type {self.device_type!r} must be 1-45 lower-case letters, digits or "
                              "'-' (GPU_K8S_UPDATE_DEVICE_TYPE)")
        for label in self.node_labels:
            key, sep, _ = label.partition("=")
            if not sep or not key:
                raise ConfigError(f"node label {label!r} is not key=value (GPU_K8S_NODE_LABELS)")


def _yaml_scalar(value: str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def render_yaml(header: str, entries: list[tuple[str, str | bool | list[str]]]) -> str:
    """A YAML mapping of scalars and lists of strings (all k3s config needs)."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for key, value in entries:
        if isinstance(value, list):
            lines.append(f"{key}:")
            lines.extend(f"  - {_yaml_scalar(item)}" for item in value)
        else:
            lines.append(f"{key}: {_yaml_scalar(value)}")
    return "\n".join(lines) + "\n"


def runtime_dropin(knobs: Knobs) -> str:
    if knobs.runtime == "docker":
        return render_yaml(
            "meta-gpu-k8s: pods run through docker (k3s's embedded cri-dockerd). docker's default\n"
            "runtime is nvidia on Jetson (/etc/docker/daemon.json), so GPU pods need no runtimeClassName.\n"
            "The kubelet's cgroup driver is docker's (native.cgroupdriver in daemon.json).",
            [("docker", True), ("kubelet-arg+", [f"cgroup-driver={knobs.cgroup_driver}"])],
        )
    entries: list[tuple[str, str | bool | list[str]]] = []
    header = ("meta-gpu-k8s: pods run in k3s's own containerd, which picks its cgroup driver\n"
              "for the host (cgroupfs on cgroup v1, systemd on the unified hierarchy).")
    if knobs.nvidia_runtime:
        # k3s finds /usr/bin/nvidia-container-runtime, adds the "nvidia" runtime and
        # RuntimeClass; making it the default lets GPU pods run without runtimeClassName.
        entries.append(("default-runtime", "nvidia"))
        header += "\nnvidia (detected by k3s) is the default runtime: GPU pods need no runtimeClassName."
    return render_yaml(header, entries)


def kubelet_dropin(knobs: Knobs) -> str | None:
    args: list[str] = []
    header = ["meta-gpu-k8s: kubelet settings for this machine."]
    if knobs.cgroup_v1:
        # Kubernetes >= 1.35 refuses cgroup v1 unless told; support ends in a future release.
        args.append("fail-cgroupv1=false")
        header.append("cgroup v1 host (linux-tegra 4.9): the kubelet is allowed to run on it.")
    if knobs.kubelet_profile == "small-4gb":
        args.extend(SMALL_4GB_KUBELET_ARGS)
        header.append("4 GB board (GPU memory shared): reservations, eviction and image GC (docs/layer.md).")
    if not args:
        return None
    return render_yaml("\n".join(header), [("kubelet-arg+", args)])


def server_dropin(knobs: Knobs) -> str | None:
    if knobs.role != "server":
        return None  # "disable" and the network policy switch are server flags
    entries: list[tuple[str, str | bool | list[str]]] = []
    if knobs.disable:
        entries.append(("disable+", list(knobs.disable)))
    if knobs.disable_network_policy:
        entries.append(("disable-network-policy", True))
    if not entries:
        return None
    return render_yaml("meta-gpu-k8s: server add-ons this machine does not run (docs/layer.md).", entries)


def images_dropin(knobs: Knobs) -> str | None:
    if not knobs.pause_image:
        return None
    return render_yaml("meta-gpu-k8s: sandbox image preloaded in the image (no registry needed).",
                       [("pause-image", knobs.pause_image)])


def labels_dropin(knobs: Knobs) -> str | None:
    if not knobs.node_labels:
        return None
    return render_yaml("meta-gpu-k8s: site labels from GPU_K8S_NODE_LABELS. GPU labels are written at\n"
                       "boot from discovery (60-gpu-k8s-gpu-labels.yaml), never baked in.",
                       [("node-label+", list(knobs.node_labels))])


def device_type_dropin(knobs: Knobs) -> str | None:
    if not knobs.device_type:
        return None
    return render_yaml("meta-gpu-k8s: the image's update device type (Mender's, default the MACHINE). The fleet\n"
                       "rollout gives each device type its own Plans and artifact (docs/fleet.md).",
                       [("node-label+", [f"{DEVICE_TYPE_LABEL}={knobs.device_type}"])])


def render(knobs: Knobs) -> dict[str, str]:
    """File name -> content of every drop-in this configuration installs."""
    knobs.validate()
    files = {
        "10-gpu-k8s-runtime.yaml": runtime_dropin(knobs),
        "20-gpu-k8s-kubelet.yaml": kubelet_dropin(knobs),
        "30-gpu-k8s-server.yaml": server_dropin(knobs),
        "40-gpu-k8s-images.yaml": images_dropin(knobs),
        "50-gpu-k8s-labels.yaml": labels_dropin(knobs),
        "55-gpu-k8s-device-type.yaml": device_type_dropin(knobs),
    }
    return {name: text for name, text in files.items() if text is not None}


def _flag(value: str, name: str) -> bool:
    if value in ("1", "yes", "true"):
        return True
    if value in ("0", "no", "false", ""):
        return False
    raise ConfigError(f"{name} must be 1 or 0, got {value!r}")


def knobs_from_args(argv: list[str]) -> tuple[Knobs, Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--role", default="server")
    parser.add_argument("--runtime", default="docker")
    parser.add_argument("--cgroup-driver", default="systemd")
    parser.add_argument("--cgroup-v1", default="0")
    parser.add_argument("--nvidia-runtime", default="0")
    parser.add_argument("--kubelet-profile", default="default")
    parser.add_argument("--disable", default="", help="space separated")
    parser.add_argument("--disable-network-policy", default="0")
    parser.add_argument("--pause-image", default="")
    parser.add_argument("--node-labels", default="", help="space separated key=value")
    parser.add_argument("--device-type", default="", help="update device type (node label)")
    args = parser.parse_args(argv)
    knobs = Knobs(
        role=args.role,
        runtime=args.runtime,
        cgroup_driver=args.cgroup_driver,
        cgroup_v1=_flag(args.cgroup_v1, "--cgroup-v1"),
        nvidia_runtime=_flag(args.nvidia_runtime, "--nvidia-runtime"),
        kubelet_profile=args.kubelet_profile,
        disable=tuple(args.disable.split()),
        disable_network_policy=_flag(args.disable_network_policy, "--disable-network-policy"),
        pause_image=args.pause_image.strip(),
        node_labels=tuple(args.node_labels.split()),
        device_type=args.device_type.strip(),
    )
    return knobs, args.output_dir


def main(argv: list[str] | None = None) -> int:
    try:
        knobs, output_dir = knobs_from_args(sys.argv[1:] if argv is None else argv)
        files = render(knobs)  # validates before anything is written
    except ConfigError as error:
        print(f"gpu-k8s-k3s-config: {error}", file=sys.stderr)
        return 2
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (output_dir / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
