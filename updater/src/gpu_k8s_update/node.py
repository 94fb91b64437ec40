"""Everything the gate and the upgrade command touch on the node, built from the settings."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_k8s_update import probes
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

    def node_status(self) -> tuple[NodeStatus | None, str]:
        return probes.node_status(self.settings.kubectl_command, self.settings.kubeconfigs, self.settings.node_name)
