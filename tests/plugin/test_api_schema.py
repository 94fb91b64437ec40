"""Our runtime-built descriptor equals what protoc makes of deviceplugin.proto."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from gpu_device_plugin.api import pb, schema

PROTO = Path(schema.__file__).with_name("deviceplugin.proto")


def protoc_descriptor(tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    grpc_tools = pytest.importorskip("grpc_tools.protoc")
    out = tmp_path / "set.pb"
    rc = grpc_tools.main(["protoc", f"-I{PROTO.parent}", f"--descriptor_set_out={out}", PROTO.name])
    assert rc == 0, "protoc failed on deviceplugin.proto"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return fds.file[0]


def normalised(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    copy = descriptor_pb2.FileDescriptorProto()
    copy.CopyFrom(fdp)
    copy.name = "x"
    for message in copy.message_type:
        for field in message.field:
            field.ClearField("json_name")
        for nested in message.nested_type:
            for field in nested.field:
                field.ClearField("json_name")
    for service in copy.service:
        for method in service.method:
            method.ClearField("options")
    return copy


def test_descriptor_matches_protoc_output_field_for_field(tmp_path: Path) -> None:
    ours = normalised(schema.file_descriptor_proto())
    theirs = normalised(protoc_descriptor(tmp_path))
    assert ours == theirs, f"schema.py and deviceplugin.proto disagree:\nours:\n{ours}\nprotoc:\n{theirs}"


def test_wire_format_of_an_allocate_response_round_trips() -> None:
    response = pb.AllocateResponse()
    container = response.container_responses.add()
    container.envs["NVIDIA_VISIBLE_DEVICES"] = "0"
    container.devices.add(container_path="/dev/nvmap", host_path="/dev/nvmap", permissions="rw")
    container.cdi_devices.add(name="nvidia.com/gpu=0")
    again = pb.AllocateResponse.FromString(response.SerializeToString())
    assert again == response
    # field 5 (cdi_devices), wire type 2 -> tag byte 0x2a inside the container message
    assert b"\x2a\x12\x0a\x10nvidia.com/gpu=0" in container.SerializeToString()


def test_names_kubelet_code_uses_exist_verbatim() -> None:
    request = pb.ContainerPreferredAllocationRequest(available_deviceIDs=["a"], must_include_deviceIDs=["a"],
                                                     allocation_size=1)
    assert list(request.available_deviceIDs) == ["a"]
    assert pb.Device(ID="x", health=pb.HEALTHY).ID == "x"
    assert pb.ContainerAllocateRequest(devices_ids=["d"]).devices_ids == ["d"]
