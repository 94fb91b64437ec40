"""Where things are on the node and how long to wait: defaults, overridable by environment
(GPU_K8S_UPDATE_<NAME>, e.g. from /etc/default/gpu-k8s-update) and then by flags."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_PREFIX = "GPU_K8S_UPDATE_"
# The A/B backends this agent drives (ab/select.py): x86-64, Jetson Nano, Jetson Orin and Thor.
AB_BACKENDS = ("mender-grub", "mender-uboot", "mender-tegra")


class SettingsError(ValueError):
    """A setting has a value we cannot use; the message names it and the fix."""


@dataclass(frozen=True)
class Settings:
    # On the data partition so the marker outlives the slot switch and a rollback.
    state_dir: Path = Path("/data/gpu-k8s-update")
    # In each root filesystem (the recipe writes it at build time): the release the slot
    # carries (artifact_name=) and its A/B backend (ab_backend=).
    image_info: Path = Path("/usr/share/gpu-k8s-update/image-info")
    ab_backend: str = ""  # '' = as image-info says; one of AB_BACKENDS
    mender_command: tuple[str, ...] = ("mender-update",)
    # Tegra (mender-tegra): the BSP's slot tool, and what meta-mender-tegra's native update
    # module leaves behind (tegra-rootfs-image: the pending marker on /data, the capsule on the ESP).
    nvbootctrl_command: tuple[str, ...] = ("nvbootctrl",)
    systemctl_command: tuple[str, ...] = ("systemctl",)
    tegra_pending_file: Path = Path("/var/lib/mender/tegra-update-pending")
    tegra_update_module: Path = Path("/usr/share/mender/modules/v3/tegra-rootfs-image")
    esp_capsule: Path = Path("/boot/efi/EFI/UpdateCapsule/TEGRA_BL.Cap")
    efivars_dir: Path = Path("/sys/firmware/efi/efivars")
    reboot_command: tuple[str, ...] = ("systemctl", "reboot")
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")
    # A Nano brings docker, k3s and the plugin up in 3-5 minutes; leave room for a slow SD card.
    gate_timeout_s: float = 900.0
    poll_interval_s: float = 10.0
    unreachable_grace_s: float = 300.0
    # The upgrade command waits this long for the gate on the new slot, then fails the job.
    wait_for_gate_s: float = 1200.0
    max_install_attempts: int = 3
    reboot_wait_s: float = 300.0  # after asking for a reboot; if we are still alive, that is an error
    docker_socket: Path | None = Path("/var/run/docker.sock")  # None: never check docker
    # A node without this program runs k3s's own containerd (the layer's knob): no docker to check.
    docker_daemon: Path = Path("/usr/bin/dockerd")
    kubelet_healthz_url: str = "http://127.0.0.1:10248/healthz"
    kubectl_command: tuple[str, ...] = ("k3s", "kubectl")
    # The first that exists. The node authorizer lets a kubelet's credentials read Nodes but
    # create no pod, so an agent runs the smoke pod only with a provisioned kubeconfig.
    kubeconfigs: tuple[Path, ...] = (
        Path("/etc/gpu-k8s-update/kubeconfig"),  # provisioned (kept on /data): docs/fleet.md
        Path("/etc/rancher/k3s/k3s.yaml"),  # servers: the admin kubeconfig k3s writes
        Path("/var/lib/rancher/k3s/agent/kubelet.kubeconfig"),  # agents: system:node:<name>
    )
    # Where the node's update state is published (annotations on its own Node, publish.py): the
    # kubelet's own credential first. The node authorizer lets a node patch its own Node object and
    # NodeRestriction admits annotations (it restricts only labels and taints), so every node
    # can write them, agents included; a server's admin kubeconfig and a provisioned one follow.
    status_kubeconfigs: tuple[Path, ...] = (
        Path("/var/lib/rancher/k3s/agent/kubelet.kubeconfig"),
        Path("/etc/rancher/k3s/k3s.yaml"),
        Path("/etc/gpu-k8s-update/kubeconfig"),
    )
    # server | agent | auto: a k3s server unit in the image (k3s_server_units) makes a server.
    # The gate of a server judges its own API server: never passed on local checks alone.
    role: str = "auto"
    k3s_server_units: tuple[Path, ...] = (
        Path("/usr/lib/systemd/system/k3s.service"),
        Path("/lib/systemd/system/k3s.service"),
    )
    # Mender's own record of what this device is ("device_type=..."; /var/lib/mender is /data/mender):
    # an artifact whose device types do not list it is one mender-update refuses.
    mender_device_type_file: Path = Path("/var/lib/mender/device_type")
    # '' = the name k3s registers (k3s_node.py): node-name in its config, the layer's
    # hostname-serial / hostname-DMI-UUID name, K3S_NODE_NAME, the hostname.
    node_name: str = ""
    k3s_config_dir: Path = Path("/etc/rancher/k3s")
    node_env_file: Path = Path("/run/gpu-k8s/k3s-node.env")
    node_name_command: tuple[str, ...] = ("/usr/libexec/gpu-k8s/gpu-k8s-k3s-node-name",)
    plugin_checkpoint: Path = Path("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
    plugin_healthz_url: str = ""  # e.g. http://127.0.0.1:9402/healthz when --metrics-address is set
    gpu: str = "auto"  # yes | no | auto (a GPU node before the update must stay one)
    smoke_image: str = ""  # a preloaded image: run a GPU smoke pod before committing ('' = off)
    smoke_timeout_s: float = 180.0
    # What the layer's gpu-k8s-data-check found on the data partition: this boot's verdict, and
    # every repair or re-made /data on record (data_check.py; the `update.gpu-k8s.io/data` annotation).
    data_state_file: Path = Path("/run/gpu-k8s/data-state.json")
    data_events_file: Path = Path("/data/gpu-k8s/data-events.log")

    @property
    def marker_file(self) -> Path:
        return self.state_dir / "marker.json"

    @property
    def gate_result_file(self) -> Path:
        return self.state_dir / "gate-result.json"

    @property
    def events_file(self) -> Path:
        return self.state_dir / "events.log"


# The command-line flag behind each setting a flag can set, for error messages.
FLAG_NAMES = {
    "state_dir": "--state-dir", "gate_timeout_s": "--timeout", "poll_interval_s": "--poll-interval",
    "unreachable_grace_s": "--unreachable-grace", "gpu": "--gpu", "wait_for_gate_s": "--wait-for-gate",
}
_COMMANDS = {"mender_command", "reboot_command", "kubectl_command", "node_name_command", "nvbootctrl_command",
             "systemctl_command"}
_PATHS = {"state_dir", "image_info", "boot_id_file", "plugin_checkpoint", "docker_daemon", "k3s_config_dir",
          "node_env_file", "tegra_pending_file", "tegra_update_module", "esp_capsule", "efivars_dir",
          "mender_device_type_file", "data_state_file", "data_events_file"}
_PATH_LISTS = {"kubeconfigs", "status_kubeconfigs", "k3s_server_units"}
ROLES = ("auto", "server", "agent")
_FLOATS = {"gate_timeout_s", "poll_interval_s", "unreachable_grace_s", "wait_for_gate_s", "reboot_wait_s",
           "smoke_timeout_s"}


def load(environ: Mapping[str, str], overrides: Mapping[str, object | None] | None = None) -> Settings:
    """Defaults, then GPU_K8S_UPDATE_* variables, then the non-None `overrides` (flags)."""
    values: dict[str, object] = {}
    # In a system-upgrade-controller job the controller names the node (k3s --node-name may
    # differ from the hostname); the variable survives `chroot /host`.
    if environ.get("SYSTEM_UPGRADE_NODE_NAME"):
        values["node_name"] = environ["SYSTEM_UPGRADE_NODE_NAME"]
    for item in dataclasses.fields(Settings):
        raw = environ.get(ENV_PREFIX + item.name.upper())
        if raw is not None:
            values[item.name] = _parse(item.name, raw, f"{ENV_PREFIX}{item.name.upper()}")
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = _parse(name, str(value), FLAG_NAMES.get(name, name))
    return Settings(**values)  # type: ignore[arg-type]


def _parse(name: str, raw: str, source: str) -> object:
    if name in _COMMANDS:
        words = tuple(shlex.split(raw))
        if not words:
            raise SettingsError(f"{source} is empty; give a command, e.g. '{name.split('_')[0]}'")
        return words
    if name in _FLOATS or name == "max_install_attempts":
        try:
            number = float(raw) if name in _FLOATS else int(raw)
        except ValueError:
            raise SettingsError(f"{source} must be a number, got {raw!r}") from None
        if number <= 0:
            raise SettingsError(f"{source} must be greater than 0, got {raw!r}")
        return number
    if name == "gpu":
        if raw not in ("yes", "no", "auto"):
            raise SettingsError(f"{source} must be yes, no or auto, got {raw!r}")
        return raw
    if name == "ab_backend":
        if raw and raw not in AB_BACKENDS:
            raise SettingsError(f"{source} must be one of {', '.join(AB_BACKENDS)} (or empty: as the image says), "
                                f"got {raw!r}")
        return raw
    if name == "role":
        if raw not in ROLES:
            raise SettingsError(f"{source} must be server, agent or auto, got {raw!r}")
        return raw
    if name == "docker_socket":
        return Path(raw) if raw else None
    if name in _PATH_LISTS:
        return tuple(Path(part) for part in raw.split(":") if part)
    if name in _PATHS:
        return Path(raw)
    return raw
