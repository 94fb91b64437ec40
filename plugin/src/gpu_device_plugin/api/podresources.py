"""The kubelet's PodResources API v1, the part telemetry reads: `List`, declared like schema.py.

Field numbers are those of k8s.io/kubelet/pkg/apis/podresources/v1/api.proto. Only what
the GPU attribution needs is declared: devices for the device plugin's GPUs, dynamic_resources
for a DRA driver's claims; `wire` skips the rest (cpu_ids, memory, topology, CDI names, share
IDs), as protobuf skips unknown fields, so newer kubelets read the same.
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
        ("dynamic_resources", 5, MESSAGE, REPEATED, "DynamicResource"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, STRING, OPTIONAL, ""),
        ("device_ids", 2, STRING, REPEATED, ""),
    ],
    # a claim the container uses (field 1, class_name, is a tombstone since 1.31)
    "DynamicResource": [
        ("claim_name", 2, STRING, OPTIONAL, ""),
        ("claim_namespace", 3, STRING, OPTIONAL, ""),
        ("claim_resources", 4, MESSAGE, REPEATED, "ClaimResource"),
    ],
    # one allocated device of that claim: driver, pool and device name identify it
    "ClaimResource": [
        ("driver_name", 2, STRING, OPTIONAL, ""),
        ("pool_name", 3, STRING, OPTIONAL, ""),
        ("device_name", 4, STRING, OPTIONAL, ""),
    ],
}
