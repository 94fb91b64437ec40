"""Everything the gate and the upgrade command touch on the node, built from the settings."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_k8s_update import probes, smoke
from gpu_k8s_update.model import HealthFacts, NodeStatus
from gpu_k8s_update.settings import Settings
from gpu_k8s_update.state import StateStore
from gpu_k8s_update.system import BootEnv, Host, Mender


@dataclass
class Node:
    settings: Settings
    mender: Mender
    bootenv: BootEnv
    host: Host
    store: StateStore

    @classmethod
    def from_settings(cls, settings: Settings) -> Node:
        return cls(
            settings=settings,
            mender=Mender(settings.mender_command),
            bootenv=BootEnv(),
            host=Host(settings.artifact_info, settings.boot_id_file, settings.reboot_command),
            store=StateStore(settings.marker_file, settings.gate_result_file, settings.events_file),
        )

    def probe_health(self, boot_time: float) -> HealthFacts:
        return probes.probe_health(self.settings, boot_time)

    def run_smoke_pod(self) -> tuple[bool, str]:
        kubeconfig = next((path for path in self.settings.kubeconfigs if path.is_file()), None)
        if kubeconfig is None:
            return False, "no kubeconfig to create the smoke pod with"
        return smoke.run_smoke_pod(self.settings.kubectl_command, kubeconfig, self.settings.node_name,
                                   self.settings.smoke_image, self.settings.smoke_timeout_s)

    def node_status(self) -> tuple[NodeStatus | None, str]:
        return probes.node_status(self.settings.kubectl_command, self.settings.kubeconfigs, self.settings.node_name)
