"""What the plugin runs with: plain values, no parsing (the policy core imports only this).

`loader` turns flags, environment and the YAML file into these; `cli.main` owns argparse.
"""

from typing import NamedTuple

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"
DEFAULT_RESOURCE = "nvidia.com/gpu"
DISCOVERY_STRATEGIES = ("auto", "tegra", "nvml", "simulated")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
# the built-in default: the hand-over the node's NVIDIA runtime honours, read from its configuration at start
# (cdi.handover); never combined with the others
DEVICE_LIST_AUTO = "auto"
# The NVIDIA Container Toolkit's feature variables (internal/modifier/cdi.go gatedDevices): "enabled" in a GPU
# container's environment adds every node of the feature (/dev/infiniband/uverbs*, /dev/nvidia-fs*, /dev/gdrdrv,
# /dev/nvidia-nvswitch*), whatever the container was allocated. Settings attribute -> variable.
FEATURE_VARIABLES = (("gds_enabled", "NVIDIA_GDS"), ("mofed_enabled", "NVIDIA_MOFED"),
                     ("gdrcopy_enabled", "NVIDIA_GDRCOPY"), ("nvswitch_enabled", "NVIDIA_NVSWITCH"))
DEVICE_ID_STRATEGIES = ("uuid", "index")
ALLOCATION_POLICIES = ("distributed", "packed")
# Which API hands this node's GPUs to pods: the device plugin (nvidia.com/gpu), the DRA driver
# (claims only), or both through DRA (claims, and nvidia.com/gpu requests mapped onto DRA by the
# DeviceClass's extendedResourceName): never one GPU through two. docs/dra.md says why the default.
ALLOCATION_APIS = ("device-plugin", "dra", "both")
MAX_SIMULATED_GPUS = 64
MAX_REPLICAS = 256


class ConfigError(ValueError):
    """A setting is invalid; the message names the flag/field and how to fix it."""


class TimeSlicing(NamedTuple):
    replicas: int = 1  # 1 = no sharing
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False


class Settings(NamedTuple):
    kubelet_socket: str = DEFAULT_KUBELET_SOCKET
    device_discovery_strategy: str = "auto"
    fail_on_init_error: bool = False
    device_list_strategy: tuple[str, ...] = (DEVICE_LIST_AUTO,)
    device_id_strategy: str = "uuid"
    pass_device_specs: bool = False
    allocation_policy: str = "distributed"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    cdi_kind: str = "meta-gpu-k8s.io/gpu"
    cdi_spec_dir: str = "/var/run/cdi"
    simulated_gpus: int = 0
    simulated_health_dir: str = ""
    host_root: str = "/"
    metrics_address: str = ""
    health_recovery_period: float = 60.0
    log_level: str = "info"
    config_file: str = ""
    # "" = not set: the device plugin then serves (as before DRA) and `gpu-device-plugin dra`, run on
    # purpose, publishes; the images' config files set it explicitly
    allocation_api: str = ""
    time_slicing: TimeSlicing = TimeSlicing()
    # the toolkit's feature devices for every allocated container (FEATURE_VARIABLES): off by default, and
    # said so in every Allocate answer, which beats an image's own "enabled" (the kubelet puts the plugin's
    # environment after the image's)
    gds_enabled: bool = False
    mofed_enabled: bool = False
    gdrcopy_enabled: bool = False
    nvswitch_enabled: bool = False

    @property
    def socket_dir(self) -> str:
        # The kubelet's socket directory also holds ours (the official plugin's convention).
        return self.kubelet_socket.rsplit("/", 1)[0] or "/"
