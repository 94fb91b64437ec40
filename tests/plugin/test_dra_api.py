"""The kubelet's DRA APIs as the driver declares them (api/dra.py): what protoc makes of the .proto
files beside them, field for field, and the bytes protobuf writes and reads, message for message
(maps of messages, enums, proto3 defaults)."""

from __future__ import annotations

import re
from pathlib import Path

import go_caches
import pytest
from google.protobuf import descriptor_pb2
from gpu_device_plugin.api import dra, schema, wire
from test_api_schema import normalised

API_DIR = Path(schema.__file__).parent
PROTO_FILES = {dra.REGISTRATION.package: "pluginregistration_v1.proto", dra.DRA_V1.package: "dra_v1.proto",
               dra.DRA_V1BETA1.package: "dra_v1beta1.proto", dra.HEALTH.package: "drahealth_v1alpha1.proto"}


def protoc_descriptor(tmp_path: Path, name: str) -> descriptor_pb2.FileDescriptorProto:
    grpc_tools = pytest.importorskip("grpc_tools.protoc")
    out = tmp_path / f"{name}.pb"
    assert grpc_tools.main(["protoc", f"-I{API_DIR}", f"--descriptor_set_out={out}", name]) == 0, name
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]


@pytest.mark.parametrize("api", dra.APIS, ids=lambda api: api.package)
def test_each_declaration_matches_protoc_output_of_its_proto_file(api: schema.Api, tmp_path: Path) -> None:
    ours = normalised(schema.file_descriptor_proto(api))
    theirs = normalised(protoc_descriptor(tmp_path, PROTO_FILES[api.package]))
    assert ours == theirs, f"api/dra.py and {PROTO_FILES[api.package]} disagree:\nours:\n{ours}\nprotoc:\n{theirs}"


def test_the_service_paths_are_the_ones_the_kubelet_dials() -> None:
    # the full method names of k8s.io/kubelet's generated clients (api_grpc.pb.go)
    assert dra.DRA_V1.method_path("DRAPlugin", "NodePrepareResources") == \
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
    assert dra.DRA_V1BETA1.method_path("DRAPlugin", "NodeUnprepareResources") == \
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"
    assert dra.REGISTRATION.method_path("Registration", "GetInfo") == "/pluginregistration.Registration/GetInfo"
    assert dra.HEALTH.method_path("DRAResourceHealth", "NodeWatchResources") == \
        "/v1alpha1.DRAResourceHealth/NodeWatchResources"


def prepare_response(classes: dict[str, type], share: bool) -> object:
    response = classes["NodePrepareResourcesResponse"]()
    ok = response.claims["3f2a-uid"]
    device = ok.devices.add() if hasattr(ok.devices, "add") else None
    values = {"request_names": ["gpu"], "pool_name": "node-a", "device_name": "gpu-0",
              "cdi_device_ids": ["k8s.gpu.meta-gpu-k8s.io/claim=3f2a-uid-gpu-0"]}
    if share:
        values["share_id"] = "a1b2"
    for key, value in values.items():
        if isinstance(value, list):
            getattr(device, key).extend(value)
        else:
            setattr(device, key, value)
    response.claims["other-uid"].error = "claim default/x is not allocated"
    response.claims["empty-uid"]  # an entry with a default value is still sent (its key)
    return response


@pytest.mark.parametrize("api", [dra.DRA_V1, dra.DRA_V1BETA1], ids=lambda api: api.package)
def test_a_map_of_messages_is_the_bytes_protobuf_writes_and_reads(api: schema.Api) -> None:
    pb = schema.protobuf_classes(api)
    theirs = prepare_response(pb, share=api is dra.DRA_V1)
    data = theirs.SerializeToString(deterministic=True)
    ours = wire.message_classes(api.messages)["NodePrepareResourcesResponse"].FromString(data)
    assert set(ours.claims) == {"3f2a-uid", "other-uid", "empty-uid"}
    device = ours.claims["3f2a-uid"].devices[0]
    assert (device.request_names, device.pool_name, device.device_name, device.cdi_device_ids) == (
        ["gpu"], "node-a", "gpu-0", ["k8s.gpu.meta-gpu-k8s.io/claim=3f2a-uid-gpu-0"])
    assert ours.claims["other-uid"].error == "claim default/x is not allocated"
    again = pb["NodePrepareResourcesResponse"].FromString(ours.SerializeToString())
    assert again == theirs


def test_an_enum_is_an_int32_on_the_wire() -> None:
    pb = schema.protobuf_classes(dra.HEALTH)
    message = pb["NodeWatchResourcesResponse"]()
    entry = message.devices.add()
    entry.device.pool_name, entry.device.device_name = "node-a", "gpu-0"
    entry.health = dra.UNHEALTHY
    entry.last_updated_time = 1_780_000_000
    entry.message = "Xid 79: fallen off the bus"
    ours = wire.message_classes(dra.HEALTH.messages)["NodeWatchResourcesResponse"].FromString(
        message.SerializeToString())
    assert (ours.devices[0].health, ours.devices[0].device.device_name) == (dra.UNHEALTHY, "gpu-0")
    assert pb["NodeWatchResourcesResponse"].FromString(ours.SerializeToString()) == message


def test_a_truncated_map_entry_is_a_decode_error_not_a_crash() -> None:
    classes = wire.message_classes(dra.DRA_V1.messages)
    good = classes["NodeUnprepareResourcesResponse"](
        claims={"uid": classes["NodeUnprepareResourceResponse"](error="boom")}).SerializeToString()
    response = classes["NodeUnprepareResourcesResponse"]
    with pytest.raises(wire.DecodeError):
        response.FromString(good[:-1])  # the entry is cut short
    with pytest.raises(wire.DecodeError):
        response.FromString(b"\x0a\x07\x0a\x03uid\x12\x09")  # the entry is whole, its value says 9 bytes, has 0


def test_the_upstream_protos_declare_the_same_fields_where_the_module_cache_has_them(tmp_path: Path) -> None:
    go_mod = (go_caches.CONFORMANCE / "go.mod").read_text()
    version = re.search(r"^\s*k8s\.io/kubelet => k8s\.io/kubelet (v\S+)", go_mod, re.M)
    assert version, "conformance/go.mod pins no k8s.io/kubelet"
    upstream = go_caches.MODULE_CACHE / f"k8s.io/kubelet@{version.group(1)}" / "pkg" / "apis"
    if not upstream.is_dir():
        pytest.skip(f"k8s.io/kubelet {version.group(1)} is not in {go_caches.MODULE_CACHE} (the conformance leg of "
                    "./task test fetches it)")
    for api, relative in ((dra.DRA_V1BETA1, "dra/v1beta1/api.proto"),
                          (dra.REGISTRATION, "pluginregistration/v1/api.proto"),
                          (dra.HEALTH, "dra-health/v1alpha1/api.proto")):
        grpc_tools = pytest.importorskip("grpc_tools.protoc")
        out = tmp_path / "up.pb"
        source = upstream / relative
        assert grpc_tools.main(["protoc", f"-I{source.parent}", f"--descriptor_set_out={out}", source.name]) == 0
        theirs = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
        fields = {(m.name, f.name, f.number, f.type) for m in theirs.message_type for f in m.field}
        ours = {(m.name, f.name, f.number, f.type) for m in schema.file_descriptor_proto(api).message_type
                for f in m.field}
        assert ours == fields, f"{relative}: {sorted(ours ^ fields)}"
