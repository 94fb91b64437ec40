"""The kubelet's APIs a DRA driver serves, declared like schema.py: plugin registration v1
(the plugin watcher's `GetInfo` / `NotifyRegistrationStatus`), the DRA node service v1 and
v1beta1 (`NodePrepareResources` / `NodeUnprepareResources`) and the DRA health stream v1alpha1
(`NodeWatchResources`).

Field names and numbers are those of k8s.io/kubelet v0.36 (`pkg/apis/pluginregistration/v1`,
`pkg/apis/dra/v1`, `pkg/apis/dra/v1beta1`, `pkg/apis/dra-health/v1alpha1`); the package names are
the protos' own, so the gRPC paths are what the kubelet dials (`/k8s.io.kubelet.pkg.apis.dra.v1.
DRAPlugin/NodePrepareResources`). `pluginregistration_v1.proto`, `dra_v1.proto`, `dra_v1beta1.proto`
and `drahealth_v1alpha1.proto` beside this module say the same in proto syntax;
tests/plugin/test_dra_api.py proves both agree.

v1's `Device.share_id` is `optional string` (proto3 presence): declared here as a plain string,
which reads and writes the same bytes whenever it is set (the driver sets it only for a share of
a device allocated more than once, and never to "").
"""

from __future__ import annotations

from .schema import BOOL, ENUM, INT64, MESSAGE, OPTIONAL, REPEATED, STRING, Api, MessageFields

# What GetInfo names: the plugin type and the services of the DRA socket (pkg/apis/dra/*/types.go).
DRA_PLUGIN_TYPE = "DRAPlugin"
V1_SERVICE = "v1.DRAPlugin"
V1BETA1_SERVICE = "v1beta1.DRAPlugin"

REGISTRATION = Api(
    "pluginregistration", "gpu_device_plugin/pluginregistration_v1.proto",
    "k8s.io/kubelet/pkg/apis/pluginregistration/v1",
    {
        "PluginInfo": [
            ("type", 1, STRING, OPTIONAL, ""),
            ("name", 2, STRING, OPTIONAL, ""),
            ("endpoint", 3, STRING, OPTIONAL, ""),
            ("supported_versions", 4, STRING, REPEATED, ""),
        ],
        "RegistrationStatus": [
            ("plugin_registered", 1, BOOL, OPTIONAL, ""),
            ("error", 2, STRING, OPTIONAL, ""),
        ],
        "RegistrationStatusResponse": [],
        "InfoRequest": [],
    },
    {"Registration": [("GetInfo", "InfoRequest", "PluginInfo", False),
                      ("NotifyRegistrationStatus", "RegistrationStatus", "RegistrationStatusResponse", False)]},
)


def _dra_messages(with_share_id: bool) -> dict[str, MessageFields]:
    device: MessageFields = [
        ("request_names", 1, STRING, REPEATED, ""),
        ("pool_name", 2, STRING, OPTIONAL, ""),
        ("device_name", 3, STRING, OPTIONAL, ""),
        ("cdi_device_ids", 4, STRING, REPEATED, ""),
    ]
    if with_share_id:
        device.append(("share_id", 5, STRING, OPTIONAL, ""))
    return {
        "NodePrepareResourcesRequest": [("claims", 1, MESSAGE, REPEATED, "Claim")],
        "NodePrepareResourcesResponse": [("claims", 1, MESSAGE, REPEATED, "map:NodePrepareResourceResponse")],
        "NodePrepareResourceResponse": [
            ("devices", 1, MESSAGE, REPEATED, "Device"),
            ("error", 2, STRING, OPTIONAL, ""),
        ],
        "Device": device,
        "NodeUnprepareResourcesRequest": [("claims", 1, MESSAGE, REPEATED, "Claim")],
        "NodeUnprepareResourcesResponse": [("claims", 1, MESSAGE, REPEATED, "map:NodeUnprepareResourceResponse")],
        "NodeUnprepareResourceResponse": [("error", 1, STRING, OPTIONAL, "")],
        "Claim": [
            ("namespace", 1, STRING, OPTIONAL, ""),
            ("uid", 2, STRING, OPTIONAL, ""),
            ("name", 3, STRING, OPTIONAL, ""),
        ],
    }


_DRA_SERVICES = {"DRAPlugin": [
    ("NodePrepareResources", "NodePrepareResourcesRequest", "NodePrepareResourcesResponse", False),
    ("NodeUnprepareResources", "NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse", False),
]}

DRA_V1 = Api("k8s.io.kubelet.pkg.apis.dra.v1", "gpu_device_plugin/dra_v1.proto", "k8s.io/kubelet/pkg/apis/dra/v1",
             _dra_messages(with_share_id=True), _DRA_SERVICES)
DRA_V1BETA1 = Api("k8s.io.kubelet.pkg.apis.dra.v1beta1", "gpu_device_plugin/dra_v1beta1.proto",
                  "k8s.io/kubelet/pkg/apis/dra/v1beta1", _dra_messages(with_share_id=False), _DRA_SERVICES)

# dra-health: HealthStatus values
UNKNOWN, HEALTHY, UNHEALTHY = 0, 1, 2

HEALTH = Api(
    "v1alpha1", "gpu_device_plugin/drahealth_v1alpha1.proto", "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1",
    {
        "NodeWatchResourcesRequest": [],
        "DeviceIdentifier": [
            ("pool_name", 1, STRING, OPTIONAL, ""),
            ("device_name", 2, STRING, OPTIONAL, ""),
        ],
        "DeviceHealth": [
            ("device", 1, MESSAGE, OPTIONAL, "DeviceIdentifier"),
            ("health", 2, ENUM, OPTIONAL, "HealthStatus"),
            ("last_updated_time", 3, INT64, OPTIONAL, ""),
            ("health_check_timeout_seconds", 4, INT64, OPTIONAL, ""),
            ("message", 5, STRING, OPTIONAL, ""),
        ],
        "NodeWatchResourcesResponse": [("devices", 1, MESSAGE, REPEATED, "DeviceHealth")],
    },
    {"DRAResourceHealth": [("NodeWatchResources", "NodeWatchResourcesRequest", "NodeWatchResourcesResponse", True)]},
    enums={"HealthStatus": [("UNKNOWN", UNKNOWN), ("HEALTHY", HEALTHY), ("UNHEALTHY", UNHEALTHY)]},
)

APIS = (REGISTRATION, DRA_V1, DRA_V1BETA1, HEALTH)
