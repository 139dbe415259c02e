"""Response (and, for tests and tools, request) encoding, compiled per kio class.

The response header is written here: v0 (correlation id) for ApiVersions and for non-flexible
responses, v1 (plus an empty tag buffer) for flexible ones — kio's `__header_schema__` on each
class already encodes that rule.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import operator
import struct
from collections.abc import Callable
from typing import Any

from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from kafscale.protocol.varint import varint_bytes

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_SIZE_AND_CORRELATION = struct.Struct(">ii")
_REQUEST_HEADER_START = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id


# --------------------------------------------------------------------------------------------
# Encoding
#
# kio's writer is pure Python and generic (one call and one BytesIO write per primitive, a
# temporary BytesIO per entity for its tags): ~20 µs for a one-partition ProduceResponse.
# The encoder below is compiled once per class from the same field metadata, packs runs of
# fixed-size fields with one struct call and appends to a single bytearray. Its output is
# byte-identical to kio's writer for every schema (tests/unit/test_protocol.py checks all of them).
# --------------------------------------------------------------------------------------------

_Encoder = Callable[[bytearray, Any], None]

_STRUCT_CODES = {
    "int8": "b", "int16": "h", "int32": "i", "int64": "q",
    "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q",
    "float64": "d", "bool": "?", "error_code": "h",
}  # fmt: skip
_I64 = struct.Struct(">q")
_ZERO_UUID = bytes(16)
_NOT_NULL = 1  # KIP-893 marker before a non-null nullable struct; null is -1 (0xFF)


def _ms(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


def _primitive_encoder(kafka_type: str, flexible: bool, optional: bool) -> _Encoder:
    code = _STRUCT_CODES.get(kafka_type)
    if code is not None:
        packer = struct.Struct(">" + code).pack

        def fixed(out: bytearray, value: Any) -> None:
            out += packer(value)

        return fixed
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        packer = (_I32 if kafka_type == "timedelta_i32" else _I64).pack

        def duration(out: bytearray, value: datetime.timedelta) -> None:
            out += packer(_ms(value))

        return duration
    if kafka_type == "datetime_i64":

        def timestamp(out: bytearray, value: datetime.datetime | None) -> None:
            out += _I64.pack(-1 if value is None else round(value.timestamp() * 1000))

        return timestamp
    if kafka_type == "uuid":

        def uuid(out: bytearray, value: Any) -> None:
            out += _ZERO_UUID if value is None else value.bytes

        return uuid
    if kafka_type not in ("string", "bytes", "records"):
        raise TypeError(f"no encoder for kafka type {kafka_type!r}")
    if flexible:

        def compact(out: bytearray, value: str | bytes | None) -> None:
            if value is None:
                if not optional:
                    raise TypeError("unexpected None for a non-nullable string/bytes field")
                out.append(0)
                return
            if isinstance(value, str):
                value = value.encode()
            out += varint_bytes(len(value) + 1)
            out += value

        return compact
    if kafka_type == "string":

        def legacy_string(out: bytearray, value: str | None) -> None:
            if value is None:
                if not optional:
                    raise TypeError("unexpected None for a non-nullable string field")
                out += b"\xff\xff"
                return
            raw = value.encode()
            out += _I16.pack(len(raw))  # struct.error above 32767, as kio refuses too
            out += raw

        return legacy_string

    def legacy_bytes(out: bytearray, value: bytes | None) -> None:
        if value is None:
            if not optional:
                raise TypeError("unexpected None for a non-nullable bytes field")
            out += b"\xff\xff\xff\xff"
            return
        out += _I32.pack(len(value))
        out += value

    return legacy_bytes


def _array_encoder(flexible: bool, element: _Encoder, code: str | None) -> _Encoder:
    def array(out: bytearray, items: Any) -> None:
        if items is None:
            out += b"\x00" if flexible else b"\xff\xff\xff\xff"
            return
        n = len(items)
        out += varint_bytes(n + 1) if flexible else _I32.pack(n)
        if code is not None:  # fixed-size elements: one pack call for all
            out += struct.pack(f">{n}{code}", *items)
            return
        for item in items:
            element(out, item)

    return array


def _field_encoder(field: dataclasses.Field[Any], flexible: bool, is_tag: bool) -> _Encoder:
    kind = classify_field(field)
    match kind:
        case PrimitiveField():
            return _primitive_encoder(get_schema_field_type(field), flexible, is_optional(field) and not is_tag)
        case PrimitiveTupleField():
            kafka_type = get_schema_field_type(field)
            element = _primitive_encoder(kafka_type, flexible, False)
            return _array_encoder(flexible, element, _STRUCT_CODES.get(kafka_type))
        case EntityField(type_=inner):
            return _entity_encoder(inner, is_optional(field) and not is_tag)
        case EntityTupleField(type_=inner):
            return _array_encoder(flexible, _entity_encoder(inner, False), None)
    raise TypeError(f"unclassifiable field {field.name}")  # pragma: no cover


def _attribute_op(name: str, encode: _Encoder) -> _Encoder:
    def op(out: bytearray, value: Any) -> None:
        encode(out, getattr(value, name))

    return op


def _fixed_run_op(names: list[str], codes: str) -> _Encoder:
    packer = struct.Struct(">" + codes).pack
    if len(names) == 1:
        name = names[0]

        def one(out: bytearray, value: Any) -> None:
            out += packer(getattr(value, name))

        return one
    getter = operator.attrgetter(*names)

    def run(out: bytearray, value: Any) -> None:
        out += packer(*getter(value))

    return run


def _tags_op(tagged: list[tuple[int, str, _Encoder, Any]]) -> _Encoder:
    if not tagged:

        def none(out: bytearray, value: Any) -> None:
            out.append(0)

        return none
    prepared = [(varint_bytes(tag), name, encode, default) for tag, name, encode, default in sorted(tagged)]

    def tags(out: bytearray, value: Any) -> None:
        # Like kio (and Kafka), a tagged field holding its default is not written at all:
        # librdkafka 2.0 fails on default-valued tags.
        present = []
        for tag_bytes, name, encode, default in prepared:
            field_value = getattr(value, name)
            if field_value == default:
                continue
            body = bytearray()
            encode(body, field_value)
            present.append((tag_bytes, body))
        out += varint_bytes(len(present))
        for tag_bytes, body in present:
            out += tag_bytes
            out += varint_bytes(len(body))
            out += body

    return tags


@functools.cache
def _entity_encoder(cls: type[Any], nullable: bool) -> _Encoder:
    flexible: bool = cls.__flexible__
    ops: list[_Encoder] = []
    run_names: list[str] = []
    run_codes = ""
    tagged: list[tuple[int, str, _Encoder, Any]] = []
    for field in dataclasses.fields(cls):
        tag = get_field_tag(field)
        if tag is not None:
            default = get_tagged_field_default(field)
            tagged.append((int(tag), field.name, _field_encoder(field, flexible, is_tag=True), default))
            continue
        if isinstance(classify_field(field), PrimitiveField):
            code = _STRUCT_CODES.get(get_schema_field_type(field))
            if code is not None:
                run_names.append(field.name)
                run_codes += code
                continue
        if run_names:
            ops.append(_fixed_run_op(run_names, run_codes))
            run_names, run_codes = [], ""
        ops.append(_attribute_op(field.name, _field_encoder(field, flexible, is_tag=False)))
    if run_names:
        ops.append(_fixed_run_op(run_names, run_codes))
    if flexible:
        ops.append(_tags_op(tagged))
    frozen = tuple(ops)

    def entity(out: bytearray, value: Any) -> None:
        for op in frozen:
            op(out, value)

    if not nullable:
        return frozen[0] if len(frozen) == 1 else entity

    def nullable_entity(out: bytearray, value: Any) -> None:
        if value is None:
            out.append(0xFF)
            return
        out.append(_NOT_NULL)
        entity(out, value)

    return nullable_entity


_response_prefixes: dict[type[Any], bytes] = {}


def encode_response(correlation_id: int, response: Any) -> bytearray:
    """The complete frame (4-byte size, response header, body) for a kio response object.

    The header version follows the response's own class, so an ApiVersions v0 fallback answer
    to a v5 request is framed as v0, which is what Kafka sends. Returns a bytearray (no final
    copy of large fetch responses); it is only meant to be written to a socket.
    """
    cls = type(response)
    prefix = _response_prefixes.get(cls)
    if prefix is None:
        # zeroed size + correlation id, + an empty tag buffer for response header v1
        prefix = bytes(9 if cls.__header_schema__.__version__ >= 1 else 8)
        _response_prefixes[cls] = prefix
    out = bytearray(prefix)
    _entity_encoder(cls, False)(out, response)
    _SIZE_AND_CORRELATION.pack_into(out, 0, len(out) - 4, correlation_id)
    return out


def readdress_response(frame: bytes, correlation_id: int) -> bytearray:
    """A copy of a frame from encode_response, answering another request (only the correlation id differs)."""
    out = bytearray(frame)
    _I32.pack_into(out, 4, correlation_id)
    return out


def encode_request(request: Any, correlation_id: int, client_id: str | None = "kafscale") -> bytes:
    """The complete frame for a kio request object (client side: tests, tools, benchmarks)."""
    cls = type(request)
    header_version = cls.__header_schema__.__version__
    out = bytearray(_REQUEST_HEADER_START.pack(0, cls.__api_key__, cls.__version__, correlation_id))
    if header_version >= 1:
        if client_id is None:
            out += _I16.pack(-1)
        else:
            raw = client_id.encode()
            out += _I16.pack(len(raw))
            out += raw
    if header_version >= 2:
        out.append(0)  # no tagged fields
    _entity_encoder(cls, False)(out, request)
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def encode_entity(value: Any) -> bytes:
    """The body bytes of any kio entity (no header, no size)."""
    out = bytearray()
    _entity_encoder(type(value), False)(out, value)
    return bytes(out)

