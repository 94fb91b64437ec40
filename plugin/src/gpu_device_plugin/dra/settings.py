"""What the DRA driver runs with besides the plugin's own Settings (discovery, host root, health):
plain values, no parsing (`options` parses flags and environment into these).

The driver name is ours, shaped like NVIDIA's `gpu.nvidia.com` so that a CEL selector written for
their driver works with ours by changing only the domain: `device.attributes["gpu.meta-gpu-k8s.io"]
.productName`. `meta-gpu-k8s.io` is the domain the plugin's CDI kind already uses.
"""

from typing import NamedTuple

DEFAULT_DRIVER = "gpu.meta-gpu-k8s.io"
# k3s writes the kubelet's own kubeconfig here on every node, agent or server, at join time: a client
# certificate for system:node:<name> (docs/dra.md, "Credentials")
DEFAULT_KUBECONFIG = "/var/lib/rancher/k3s/agent/kubelet.kubeconfig"
DEFAULT_PLUGINS_REGISTRY = "/var/lib/kubelet/plugins_registry"
KUBELET_PLUGINS = "/var/lib/kubelet/plugins"
DEFAULT_CDI_DIR = "/var/run/cdi"
MULTIPLE_ALLOCATIONS = ("auto", "on", "off")
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


class DraSettings(NamedTuple):
    kubeconfig: str = DEFAULT_KUBECONFIG
    node_name: str = ""  # "" = the node the kubeconfig's identity is (system:node:<name>)
    driver_name: str = DEFAULT_DRIVER
    plugins_registry_dir: str = DEFAULT_PLUGINS_REGISTRY
    kubelet_plugins_dir: str = KUBELET_PLUGINS
    plugin_dir: str = ""  # "" = <kubelet_plugins_dir>/<driver name>
    cdi_dir: str = DEFAULT_CDI_DIR
    state_dir: str = ""  # "" = the plugin dir
    # publish GPUs with allowMultipleAllocations (consumable memory): on, off, or auto = integrated GPUs only
    multiple_allocations: str = "auto"
    unhealthy_taint_effect: str = "NoSchedule"
    api_timeout: float = 10.0

    @property
    def socket_dir(self) -> str:
        return self.plugin_dir or f"{self.kubelet_plugins_dir}/{self.driver_name}"

    @property
    def checkpoint_dir(self) -> str:
        return self.state_dir or self.socket_dir

    @property
    def dra_socket(self) -> str:
        return f"{self.socket_dir}/dra.sock"

    @property
    def registration_socket(self) -> str:
        return f"{self.plugins_registry_dir}/{self.driver_name}-reg.sock"
