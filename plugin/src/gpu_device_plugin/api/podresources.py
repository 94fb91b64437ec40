"""The kubelet's PodResources API v1, the part telemetry reads: `List`, declared like schema.py.

Field numbers are those of k8s.io/kubelet/pkg/apis/podresources/v1/api.proto. Only what
the GPU attribution needs is declared: `wire` skips the rest (cpu_ids, memory, topology,
dynamic_resources), as protobuf skips unknown fields, so newer kubelets read the same.
tests/plugin/test_metrics_podresources.py serves the full message set from grpcio and
proves this declaration reads it.
"""

from __future__ import annotations

from .schema import MESSAGE, OPTIONAL, REPEATED, STRING, MessageFields

PACKAGE = "v1"
LIST_METHOD = f"/{PACKAGE}.PodResourcesLister/List"
# Where the kubelet serves it, beside its device-plugins directory (`<kubelet root>/pod-resources`).
SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

MESSAGES: dict[str, MessageFields] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, MESSAGE, REPEATED, "PodResources")],
    "PodResources": [
        ("name", 1, STRING, OPTIONAL, ""),
        ("namespace", 2, STRING, OPTIONAL, ""),
        ("containers", 3, MESSAGE, REPEATED, "ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, STRING, OPTIONAL, ""),
        ("devices", 2, MESSAGE, REPEATED, "ContainerDevices"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, STRING, OPTIONAL, ""),
        ("device_ids", 2, STRING, REPEATED, ""),
    ],
}
