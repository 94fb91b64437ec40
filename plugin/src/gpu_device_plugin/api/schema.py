"""The v1beta1 messages and services, declared in plain Python.

The plugin reads and writes them with `wire` (no protobuf runtime). For Python clients
(`pb`, the tests) protobuf classes are built from the same declaration at import. Why not
protoc output: generated `_pb2` modules are tied to the protobuf runtime that generated
them (3.20-era code breaks on newer runtimes and the reverse), and our images carry
protobuf 3.20 (kirkstone) up to 6.x/7.x. `tests/plugin/test_api_schema.py` proves the
declaration matches `deviceplugin.proto`.
"""

from __future__ import annotations

from typing import Any

PACKAGE = "v1beta1"
FILE_NAME = "gpu_device_plugin/deviceplugin_v1beta1.proto"

# FieldDescriptorProto's type and label numbers (descriptor.proto), without importing protobuf
STRING, BOOL, INT32, INT64, MESSAGE, ENUM = 9, 8, 5, 3, 11, 14
OPTIONAL, REPEATED = 1, 3

# Constants of the kubelet's v1beta1 contract.
VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET = DEVICE_PLUGIN_PATH + "kubelet.sock"

# (field name, number, type, label, message or enum type name or ""); "map" marks map<string,string>,
# "map:Name" map<string, Name>.
MessageFields = list[tuple[str, int, Any, Any, str]]
MESSAGES: dict[str, MessageFields] = {
    "DevicePluginOptions": [
        ("pre_start_required", 1, BOOL, OPTIONAL, ""),
        ("get_preferred_allocation_available", 2, BOOL, OPTIONAL, ""),
    ],
    "RegisterRequest": [
        ("version", 1, STRING, OPTIONAL, ""),
        ("endpoint", 2, STRING, OPTIONAL, ""),
        ("resource_name", 3, STRING, OPTIONAL, ""),
        ("options", 4, MESSAGE, OPTIONAL, "DevicePluginOptions"),
    ],
    "Empty": [],
    "ListAndWatchResponse": [("devices", 1, MESSAGE, REPEATED, "Device")],
    "TopologyInfo": [("nodes", 1, MESSAGE, REPEATED, "NUMANode")],
    "NUMANode": [("ID", 1, INT64, OPTIONAL, "")],
    "Device": [
        ("ID", 1, STRING, OPTIONAL, ""),
        ("health", 2, STRING, OPTIONAL, ""),
        ("topology", 3, MESSAGE, OPTIONAL, "TopologyInfo"),
    ],
    "PreStartContainerRequest": [("devices_ids", 1, STRING, REPEATED, "")],
    "PreStartContainerResponse": [],
    "PreferredAllocationRequest": [
        ("container_requests", 1, MESSAGE, REPEATED, "ContainerPreferredAllocationRequest"),
    ],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, STRING, REPEATED, ""),
        ("must_include_deviceIDs", 2, STRING, REPEATED, ""),
        ("allocation_size", 3, INT32, OPTIONAL, ""),
    ],
    "PreferredAllocationResponse": [
        ("container_responses", 1, MESSAGE, REPEATED, "ContainerPreferredAllocationResponse"),
    ],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, STRING, REPEATED, "")],
    "AllocateRequest": [("container_requests", 1, MESSAGE, REPEATED, "ContainerAllocateRequest")],
    "ContainerAllocateRequest": [("devices_ids", 1, STRING, REPEATED, "")],
    "CDIDevice": [("name", 1, STRING, OPTIONAL, "")],
    "AllocateResponse": [("container_responses", 1, MESSAGE, REPEATED, "ContainerAllocateResponse")],
    "ContainerAllocateResponse": [
        ("envs", 1, MESSAGE, REPEATED, "map"),
        ("mounts", 2, MESSAGE, REPEATED, "Mount"),
        ("devices", 3, MESSAGE, REPEATED, "DeviceSpec"),
        ("annotations", 4, MESSAGE, REPEATED, "map"),
        ("cdi_devices", 5, MESSAGE, REPEATED, "CDIDevice"),
    ],
    "Mount": [
        ("container_path", 1, STRING, OPTIONAL, ""),
        ("host_path", 2, STRING, OPTIONAL, ""),
        ("read_only", 3, BOOL, OPTIONAL, ""),
    ],
    "DeviceSpec": [
        ("container_path", 1, STRING, OPTIONAL, ""),
        ("host_path", 2, STRING, OPTIONAL, ""),
        ("permissions", 3, STRING, OPTIONAL, ""),
    ],
}

# service -> [(method, request, response, server_streaming)]
SERVICES: dict[str, list[tuple[str, str, str, bool]]] = {
    "Registration": [("Register", "RegisterRequest", "Empty", False)],
    "DevicePlugin": [
        ("GetDevicePluginOptions", "Empty", "DevicePluginOptions", False),
        ("ListAndWatch", "Empty", "ListAndWatchResponse", True),
        ("GetPreferredAllocation", "PreferredAllocationRequest", "PreferredAllocationResponse", False),
        ("Allocate", "AllocateRequest", "AllocateResponse", False),
        ("PreStartContainer", "PreStartContainerRequest", "PreStartContainerResponse", False),
    ],
}


def _map_entry_name(field_name: str) -> str:
    # protoc's naming for the synthetic entry message of a map field: envs -> EnvsEntry
    return "".join(part.capitalize() for part in field_name.split("_")) + "Entry"


MAP = "map"  # type name of a map<string, string> field
MAP_OF = "map:"  # prefix of a map<string, Message> field's type name: "map:NodePrepareResourceResponse"


class Api:
    """One proto file's declaration: its package, messages (schema.MESSAGES' form) and services
    (schema.SERVICES' form). Other APIs (the kubelet's DRA, plugin registration) are declared the same way."""

    def __init__(self, package: str, file_name: str, go_package: str, messages: dict[str, MessageFields],
                 services: dict[str, list[tuple[str, str, str, bool]]],
                 enums: dict[str, list[tuple[str, int]]] | None = None) -> None:
        self.package = package
        self.enums = enums or {}
        self.file_name = file_name
        self.go_package = go_package
        self.messages = messages
        self.services = services

    def method_path(self, service: str, method: str) -> str:
        return f"/{self.package}.{service}/{method}"


DEVICE_PLUGIN = Api(PACKAGE, FILE_NAME, "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1", MESSAGES, SERVICES)


def file_descriptor_proto(api: Api = DEVICE_PLUGIN) -> Any:
    """The whole API as a FileDescriptorProto (what protoc would produce)."""
    from google.protobuf import descriptor_pb2

    package = api.package
    fdp = descriptor_pb2.FileDescriptorProto(name=api.file_name, package=package, syntax="proto3")
    fdp.options.go_package = api.go_package
    for enum_name, values in api.enums.items():
        enum = fdp.enum_type.add(name=enum_name)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)
    for msg_name, fields in api.messages.items():
        msg = fdp.message_type.add(name=msg_name)
        for name, number, ftype, label, type_name in fields:
            field = msg.field.add(name=name, number=number, type=ftype, label=label)
            if type_name == MAP or type_name.startswith(MAP_OF):
                entry = msg.nested_type.add(name=_map_entry_name(name))
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=STRING, label=OPTIONAL)
                value = entry.field.add(name="value", number=2, type=STRING, label=OPTIONAL)
                if type_name.startswith(MAP_OF):
                    value.type = MESSAGE
                    value.type_name = f".{package}.{type_name[len(MAP_OF):]}"
                field.type_name = f".{package}.{msg_name}.{entry.name}"
            elif type_name:
                field.type_name = f".{package}.{type_name}"
    for svc_name, methods in api.services.items():
        svc = fdp.service.add(name=svc_name)
        for method, req, resp, streaming in methods:
            m = svc.method.add(name=method, input_type=f".{package}.{req}", output_type=f".{package}.{resp}")
            if streaming:
                m.server_streaming = True
    return fdp


def protobuf_classes(api: Api = DEVICE_PLUGIN) -> dict[str, type]:
    """The messages as protobuf classes (protobuf 3.20 to 7.x)."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(file_descriptor_proto(api).SerializeToString())
    get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22
    factory = None if get_class is not None else message_factory.MessageFactory()  # protobuf 3.20
    return {name: (get_class or factory.GetPrototype)(pool.FindMessageTypeByName(f"{api.package}.{name}"))
            for name in api.messages}
