"""`wire` writes and reads the bytes the protobuf runtime does, for every v1beta1 message."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_device_plugin.api import pb, wire
from gpu_device_plugin.api.schema import BOOL, INT32, INT64, MESSAGES, REPEATED, STRING


def sample(name: str, depth: int = 0) -> dict[str, Any]:
    """Every field of the message set to something other than its default (two of each repeated)."""
    values: dict[str, Any] = {}
    for field, number, ftype, label, type_name in MESSAGES[name]:
        if type_name == "map":
            values[field] = {"KEY_Ä": "välue", f"k{number}": ""}
        elif type_name:
            nested = [sample(type_name, depth + 1) for _ in range(2 if label == REPEATED else 1)] if depth < 3 else []
            values[field] = nested if label == REPEATED else (nested[0] if nested else None)
        else:
            one = {STRING: f"{field}-✓-{number}", BOOL: True, INT32: -(2 ** 31), INT64: 2 ** 62 + number}[ftype]
            values[field] = [one, {STRING: "", BOOL: False, INT32: 7, INT64: -1}[ftype]] if label == REPEATED else one
    return values


def as_protobuf(name: str, values: dict[str, Any]) -> Any:
    message = pb.CLASSES[name]()
    for field, _, _, label, type_name in MESSAGES[name]:
        value = values.get(field)
        if type_name == "map":
            getattr(message, field).update(value)
        elif type_name and label == REPEATED:
            for item in value:
                getattr(message, field).add().CopyFrom(as_protobuf(type_name, item))
        elif type_name:
            if value is not None:
                getattr(message, field).CopyFrom(as_protobuf(type_name, value))
        elif label == REPEATED:
            getattr(message, field).extend(value)
        else:
            setattr(message, field, value)
    return message


def as_wire(name: str, values: dict[str, Any]) -> Any:
    fields = {}
    for field, _, _, label, type_name in MESSAGES[name]:
        value = values.get(field)
        if type_name and type_name != "map":
            value = [as_wire(type_name, v) for v in value] if label == REPEATED else (
                as_wire(type_name, value) if value is not None else None)
        fields[field] = value
    return wire.CLASSES[name](**fields)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_every_message_reads_and_writes_what_protobuf_does(name: str) -> None:
    values = sample(name)
    theirs = as_protobuf(name, values)
    ours = as_wire(name, values)
    assert wire.CLASSES[name].FromString(theirs.SerializeToString()) == ours
    assert pb.CLASSES[name].FromString(ours.SerializeToString()) == theirs
    assert wire.CLASSES[name].FromString(b"") == wire.CLASSES[name]()
    assert wire.CLASSES[name]().SerializeToString() == pb.CLASSES[name]().SerializeToString() == b""


def test_defaults_are_not_written_and_an_empty_nested_message_is() -> None:
    device = wire.Device(ID="", health="Healthy", topology=wire.TopologyInfo())
    assert device.SerializeToString() == pb.Device(health="Healthy", topology=pb.TopologyInfo()).SerializeToString()


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    known = pb.ContainerAllocateRequest(devices_ids=["a"]).SerializeToString()
    unknown = bytes([99 << 3 & 0xFF | 0x80, 99 >> 4, 0x96, 0x01,  # field 99 varint 150 (two-byte tag)
                     (10 << 3) | 5, 1, 2, 3, 4,  # field 10 fixed32
                     (11 << 3) | 1, *range(8),  # field 11 fixed64
                     (12 << 3) | 2, 2, 0x41, 0x42])  # field 12 bytes
    assert wire.ContainerAllocateRequest.FromString(unknown + known).devices_ids == ["a"]
    # a known number with another wire type is skipped too (protobuf keeps it as unknown)
    assert wire.ContainerPreferredAllocationRequest.FromString(bytes([(3 << 3) | 2, 1, 0x41])).allocation_size == 0


@pytest.mark.parametrize("data", [
    b"\x0a\xff\x7f",  # a length past the end
    b"\x0a\x02\xff\xfe",  # a string that is not UTF-8
    b"\x08",  # a varint that never ends
    b"\x0b",  # wire type 3 (groups) is not proto3
    b"\x00\x01",  # field number 0
    b"\x0d\x01\x02",  # fixed32 cut short
])
def test_malformed_bytes_are_a_decode_error(data: bytes) -> None:
    with pytest.raises(wire.DecodeError):
        wire.ContainerAllocateRequest.FromString(data)


def test_unknown_attributes_are_refused() -> None:
    with pytest.raises(TypeError, match="no field devices"):
        wire.AllocateRequest(devices=[])


def test_both_modules_name_every_message_of_the_api_and_nothing_else() -> None:
    for module in (wire, pb):
        assert {name: getattr(module, name) for name in MESSAGES} == module.CLASSES
    assert wire.AllocateResponse.__name__ == "AllocateResponse"
    assert pb.AllocateResponse.DESCRIPTOR.full_name == "v1beta1.AllocateResponse"
