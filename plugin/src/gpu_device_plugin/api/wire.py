"""The v1beta1 messages on the protobuf wire, without the protobuf runtime.

The plugin serves with its own gRPC code (grpc_server), so the protobuf runtime would be
there only to turn ~20 small messages into bytes and back: it cost about a fifth of the
start-up CPU and several MiB of memory. The classes here are made from the same
declaration as the protobuf ones (schema.MESSAGES) and read and write the same bytes
(proto3: defaults are not written, unknown fields are skipped, strings are UTF-8);
tests/plugin/test_wire.py proves it against the protobuf runtime, message by message.

Attribute names are the field names, as with protobuf: `request.container_requests[0].devices_ids`.
"""

from __future__ import annotations

from typing import Any

from .schema import BOOL, ENUM, INT32, INT64, MAP, MAP_OF, MESSAGES, REPEATED, STRING, MessageFields


class DecodeError(ValueError):
    """Bytes that are not a valid message of the expected type."""


_LENGTH, _VARINT, _FIXED64, _FIXED32 = 2, 0, 1, 5
# field kinds: how a field is read and written (_MAP: map<string, string>; _MAP_MSG: map<string, Message>)
_STR, _BOOL, _I32, _I64, _MSG, _MAP, _MAP_MSG = range(7)


class _Field:
    __slots__ = ("name", "number", "kind", "repeated", "message", "tag")

    def __init__(self, name: str, number: int, kind: int, repeated: bool, message: str) -> None:
        self.name = name
        self.number = number
        self.kind = kind
        self.repeated = repeated
        self.message = message  # the nested message's name (kind _MSG)
        wire_type = _VARINT if kind in (_BOOL, _I32, _I64) else _LENGTH
        self.tag = _varint(number << 3 | wire_type)


def _kind(ftype: Any, type_name: str) -> int:
    if type_name == MAP:
        return _MAP
    if type_name.startswith(MAP_OF):
        return _MAP_MSG
    if ftype == ENUM:  # an enum is an int32 on the wire
        return _I32
    if type_name:
        return _MSG
    return {STRING: _STR, BOOL: _BOOL, INT32: _I32, INT64: _I64}[ftype]


_UNSET = object()
_SCALAR_DEFAULTS = {_STR: "", _BOOL: False, _I32: 0, _I64: 0, _MSG: None}


def _default(field: _Field) -> tuple[Any, Any]:
    """(value, factory): repeated fields and maps get a new container per message."""
    if field.kind in (_MAP, _MAP_MSG):
        return None, dict
    if field.repeated:
        return None, list
    return _SCALAR_DEFAULTS[field.kind], None


class Message:
    """Base of the generated message classes; `_fields` is set per class."""

    __slots__ = ()
    _fields: tuple[_Field, ...] = ()
    _classes: dict[str, type[Message]] = {}  # the declaration this class belongs to: nested types by name
    _by_number: dict[int, _Field] = {}
    _names: frozenset[str] = frozenset()
    _defaults: tuple[tuple[str, Any, Any], ...] = ()

    def __init__(self, **values: Any) -> None:
        if not values:  # what decoding makes: defaults only
            for name, default, factory in self._defaults:  # factory: a fresh list or dict per message
                setattr(self, name, factory() if factory else default)
            return
        if not values.keys() <= self._names:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(values.keys() - self._names)}")
        for name, default, factory in self._defaults:
            value = values.get(name, _UNSET)
            setattr(self, name, value if value is not _UNSET else factory() if factory else default)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, f.name) == getattr(other, f.name) for f in self._fields)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in self._fields)
        return f"{type(self).__name__}({shown})"

    def SerializeToString(self) -> bytes:  # protobuf's names: the server calls either kind
        out = bytearray()
        _encode(self, out)
        return bytes(out)

    @classmethod
    def FromString(cls, data: bytes) -> Any:
        message = cls()
        _decode(message, memoryview(data))
        return message


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]  # tags, short lengths, small numbers: nearly every varint written
    if value < 0:
        value += 1 << 64  # negative int32/int64: ten bytes of two's complement, as protobuf writes them
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = [bytes((value,)) for value in range(0x80)]


def _encode(message: Message, out: bytearray) -> None:
    for field in message._fields:
        value = getattr(message, field.name)
        kind = field.kind
        if kind == _STR:
            for item in (value if field.repeated else (value,) if value else ()):
                data = item.encode()
                out += field.tag
                out += _varint(len(data))
                out += data
        elif kind == _MSG:
            for item in (value if field.repeated else (value,) if value is not None else ()):
                nested = bytearray()
                _encode(item, nested)
                out += field.tag
                out += _varint(len(nested))
                out += nested
        elif kind == _MAP:
            for key, item in value.items():
                entry = bytearray()
                for number, text in ((1, key), (2, item)):
                    data = text.encode()
                    entry.append(number << 3 | _LENGTH)
                    entry += _varint(len(data))
                    entry += data
                out += field.tag
                out += _varint(len(entry))
                out += entry
        elif kind == _MAP_MSG:
            for key, item in value.items():
                data = key.encode()
                nested = bytearray()
                _encode(item, nested)
                entry = bytearray(b"\x0a")  # field 1, length-delimited: the key
                entry += _varint(len(data))
                entry += data
                entry += b"\x12"  # field 2, length-delimited: the message
                entry += _varint(len(nested))
                entry += nested
                out += field.tag
                out += _varint(len(entry))
                out += entry
        elif value:  # bool, int32, int64: proto3 writes no zero
            out += field.tag
            out += _varint(int(value))


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise DecodeError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint too long")


def _decode(message: Message, data: memoryview) -> None:
    pos, end = 0, len(data)
    by_number = message._by_number
    while pos < end:
        key = data[pos]
        if key < 0x80:  # one-byte keys and lengths are nearly all of them: read inline
            pos += 1
        else:
            key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise DecodeError("field number 0")
        if wire_type == _VARINT:
            value, pos = _read_varint(data, pos)
        elif wire_type == _LENGTH:
            if pos < end and data[pos] < 0x80:
                length = data[pos]
                pos += 1
            else:
                length, pos = _read_varint(data, pos)
            if pos + length > end:
                raise DecodeError("truncated length-delimited field")
            value, pos = data[pos:pos + length], pos + length
        elif wire_type in (_FIXED64, _FIXED32):
            pos += 8 if wire_type == _FIXED64 else 4
            if pos > end:
                raise DecodeError("truncated fixed-width field")
            continue
        else:
            raise DecodeError(f"invalid wire type {wire_type}")
        field = by_number.get(number)
        expected = _VARINT if field is not None and field.kind in (_BOOL, _I32, _I64) else _LENGTH
        if field is None or wire_type != expected:
            continue  # unknown field (or one of another type): skipped, as protobuf does
        _store(message, field, value)


def _store(message: Message, field: _Field, value: Any) -> None:
    kind = field.kind
    if kind == _STR:
        try:
            text = str(value, "utf-8")
        except UnicodeDecodeError:
            raise DecodeError(f"field {field.name} is not valid UTF-8") from None
        if field.repeated:
            getattr(message, field.name).append(text)
        else:
            setattr(message, field.name, text)
    elif kind == _MSG:
        nested = message._classes[field.message]()
        _decode(nested, value)
        if field.repeated:
            getattr(message, field.name).append(nested)
        else:
            setattr(message, field.name, nested)
    elif kind == _MAP:
        entry = _MapEntry()
        _decode(entry, value)
        getattr(message, field.name)[entry.key] = entry.value
    elif kind == _MAP_MSG:
        key, nested = _map_entry(value, message._classes[field.message])
        getattr(message, field.name)[key] = nested
    elif kind == _BOOL:
        setattr(message, field.name, bool(value))
    else:
        bits = 32 if kind == _I32 else 64
        value &= (1 << bits) - 1
        setattr(message, field.name, value - (1 << bits) if value >> (bits - 1) else value)


def _map_entry(data: memoryview, value_class: type[Message]) -> tuple[str, Message]:
    """One map<string, Message> entry: the key (field 1) and the value (field 2, absent: a default message)."""
    key, value = "", value_class()
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = _read_varint(data, pos)
        if tag & 7 == _VARINT:
            _, pos = _read_varint(data, pos)
            continue
        if tag & 7 in (_FIXED64, _FIXED32):
            pos += 8 if tag & 7 == _FIXED64 else 4
            continue
        if tag & 7 != _LENGTH:
            raise DecodeError(f"invalid wire type {tag & 7} in a map entry")
        length, pos = _read_varint(data, pos)
        if pos + length > end:
            raise DecodeError("truncated map entry")
        chunk, pos = data[pos:pos + length], pos + length
        if tag >> 3 == 1:
            try:
                key = str(chunk, "utf-8")
            except UnicodeDecodeError:
                raise DecodeError("map key is not valid UTF-8") from None
        elif tag >> 3 == 2:
            value = value_class()
            _decode(value, chunk)
    if pos > end:
        raise DecodeError("truncated map entry")
    return key, value


def _make(name: str, fields: list[_Field], classes: dict[str, type[Message]]) -> type[Message]:
    cls = type(name, (Message,), {"__slots__": tuple(f.name for f in fields), "__module__": __name__})
    cls._classes = classes
    cls._fields = tuple(fields)
    cls._by_number = {f.number: f for f in fields}
    cls._names = frozenset(f.name for f in fields)
    cls._defaults = tuple((f.name, *_default(f)) for f in fields)
    return cls


_MapEntry = _make("MapEntry", [_Field("key", 1, _STR, False, ""), _Field("value", 2, _STR, False, "")], {})


def message_classes(messages: dict[str, MessageFields]) -> dict[str, type[Message]]:
    """Classes for one declaration in schema.MESSAGES' form; nested types resolve within it, so a
    second API (the kubelet's PodResources) reads and writes its bytes with the same code."""
    classes: dict[str, type[Message]] = {}
    for name, fields in messages.items():
        classes[name] = _make(name, [_Field(fname, number, _kind(ftype, type_name),
                                             label == REPEATED and not type_name.startswith(MAP),
                                             _nested_name(ftype, type_name))
                                     for fname, number, ftype, label, type_name in fields], classes)
    return classes


def _nested_name(ftype: Any, type_name: str) -> str:
    """The message class a field reads into: its type, a map's value type, nothing for scalars and enums."""
    if type_name == MAP or ftype == ENUM:
        return ""
    return type_name[len(MAP_OF):] if type_name.startswith(MAP_OF) else type_name


CLASSES = message_classes(MESSAGES)

# every message class as a module attribute under its proto name (wire.Device, pb.Device)
globals().update(CLASSES)
