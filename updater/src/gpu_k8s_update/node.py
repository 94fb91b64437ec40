"""Everything the gate and the upgrade command touch on the node, built from the settings."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_k8s_update import k3s_node, probes, smoke
from gpu_k8s_update.ab import ABBackend, backend_for
from gpu_k8s_update.model import HealthFacts, NodeStatus
from gpu_k8s_update.settings import Settings
from gpu_k8s_update.state import StateStore
from gpu_k8s_update.system import Host


@dataclass
class Node:
    settings: Settings
    ab: ABBackend  # the image's A/B mechanism (ab/)
    host: Host
    store: StateStore
    node_name: str = ""
    node_name_source: str = ""

    @classmethod
    def from_settings(cls, settings: Settings) -> Node:
        return cls(
            settings=settings,
            ab=backend_for(settings),
            host=Host(settings.boot_id_file, settings.reboot_command),
            store=StateStore(settings.marker_file, settings.gate_result_file, settings.events_file),
        )

    def __post_init__(self) -> None:
        if self.node_name:
            return
        if self.settings.node_name:
            self.node_name, self.node_name_source = self.settings.node_name, "configured"
            return
        paths = k3s_node.NamingPaths(
            config_dir=self.settings.k3s_config_dir,
            node_env=self.settings.node_env_file,
            naming_command=self.settings.node_name_command,
        )
        self.node_name, self.node_name_source = k3s_node.k3s_node_name(paths)

    def probe_health(self, boot_time: float) -> HealthFacts:
        return probes.probe_health(self.settings, boot_time, self.node_name)

    def run_smoke_pod(self) -> tuple[bool, str]:
        kubeconfig = next((path for path in self.settings.kubeconfigs if path.is_file()), None)
        if kubeconfig is None:
            return False, "no kubeconfig to create the smoke pod with"
        return smoke.run_smoke_pod(self.settings.kubectl_command, kubeconfig, self.node_name,
                                   self.settings.smoke_image, self.settings.smoke_timeout_s)

    def node_status(self) -> tuple[NodeStatus | None, str, bool]:
        return probes.node_status(self.settings.kubectl_command, self.settings.kubeconfigs, self.node_name)
