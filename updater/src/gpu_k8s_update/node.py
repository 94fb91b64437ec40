"""Everything the gate and the upgrade command touch on the node, built from the settings."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpu_k8s_update import data_check, k3s_node, probes, publish, smoke
from gpu_k8s_update.ab import ABBackend, backend_for
from gpu_k8s_update.model import HealthFacts, NodeStatus
from gpu_k8s_update.settings import Settings
from gpu_k8s_update.state import StateStore
from gpu_k8s_update.system import Host, SystemStateError

log = logging.getLogger(__name__)


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

    @property
    def is_server(self) -> bool:
        """A k3s server (control-plane node): its API server runs here."""
        if self.settings.role != "auto":
            return self.settings.role == "server"
        return any(unit.is_file() for unit in self.settings.k3s_server_units)

    def device_type(self) -> str:
        """Mender's device type of this node ('device_type=...'), the one its artifacts must name."""
        path = self.settings.mender_device_type_file
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            raise SystemStateError(f"cannot read Mender's device type from {path}: {error.strerror}") from None
        for line in text.splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and key.strip() == "device_type" and value.strip():
                return value.strip()
        raise SystemStateError(f"{path} has no device_type=... line")

    def data_report(self) -> data_check.DataReport:
        """What gpu-k8s-data-check did to /data since the last update this node committed."""
        return data_check.report(self.settings.data_state_file, self.settings.data_events_file,
                                 self.store.recent_events(None))

    def data_events_count(self) -> int:
        """Lines in the data-events log now: the gate records it with each commit (data_check.py)."""
        return len(data_check.read_event_lines(self.settings.data_events_file))

    def publish_data(self) -> tuple[bool, str]:
        """Only the data partition's annotation (a merge patch leaves the update state as it is)."""
        value = self.data_report().annotation
        done, detail = publish.publish(self.settings.kubectl_command, self.settings.status_kubeconfigs,
                                       self.node_name, {publish.DATA: value})
        return done, f"{publish.DATA}={value}: {detail}"

    def publish_state(self, state: str, target: str, reason: str) -> bool:
        """Best effort: the update state and the data partition's as annotations on this node's
        Node object (publish.py)."""
        try:
            booted = self.ab.booted_version()
            slot = publish.slot_label(self.ab.slots())
        except SystemStateError:
            booted, slot = "?", "?"
        values = publish.annotations(state, target, reason, booted, slot, self.ab.name,
                                     self.data_report().annotation)
        done, detail = publish.publish(self.settings.kubectl_command, self.settings.status_kubeconfigs,
                                       self.node_name, values)
        if done:
            log.debug("status %s %s published on node %s (%s)", state, target, self.node_name, detail)
        else:
            log.info("status %s %s not published on node %s: %s", state, target, self.node_name, detail)
        return done
