"""Request decoding and response encoding with kio, cached per (api_key, version).

Decoding uses kio's native (Rust) reader. That reader sizes every array with
`Vec::with_capacity(length_from_the_wire)` before reading a single element, so one 5-byte varint
claiming 4 billion elements makes it allocate 32 GiB and, when the allocation fails, *abort the
whole process* (Rust's alloc-error handler; no Python exception). A request from any client
could kill the broker. A length guard (`_entity_guard`) therefore walks the request first, in
Python, with the same schema, and rejects any array whose claimed length cannot fit in the
bytes that are left. It skips strings and record batches by their length prefix without
copying, so its cost is a few microseconds per request whatever the payload size.

Encoding uses an encoder compiled per class from kio's field metadata (see "Encoding" below
for why not kio's own writer); the response header is written here: v0 (correlation id) for
ApiVersions and for non-flexible responses, v1 (plus an empty tag buffer) for flexible ones —
kio's `__header_schema__` on each class already encodes that rule.

kio 0.6.2 is pinned and this module uses two of its private helpers (`kio.serial._introspect`,
`kio.serial._implicit_defaults`) so that the guard and the encoder read the schemas exactly as
kio's reader and writer do; tests/test_protocol.py compares both against kio on every schema.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import operator
import struct
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader
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

from kafscale.protocol.errors import ErrorCode, MalformedRequest, UnknownApiKey, UnsupportedApiVersion

__all__ = [
    "MAX_ELEMENTS",
    "decode_request",
    "decode_response",
    "encode_entity",
    "encode_request",
    "encode_response",
    "known_versions",
    "make",
    "nested",
    "request_class",
    "response_class",
    "validate_lengths",
]

T = TypeVar("T")

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_SIZE_AND_CORRELATION = struct.Struct(">ii")
_REQUEST_HEADER_START = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id


# --------------------------------------------------------------------------------------------
# Schema classes
# --------------------------------------------------------------------------------------------


# Built once: caches keyed by values from the wire must not grow with garbage input.
_KNOWN_VERSIONS: dict[int, tuple[int, int]] = {
    int(key): (min(schema_name_map[name]), max(schema_name_map[name]))
    for key, name in api_key_map.items()
    if name in schema_name_map
}


def known_versions(api_key: int) -> tuple[int, int] | None:
    """The (min, max) request versions kio 0.6.2 has schemas for, or None for an unknown key."""
    return _KNOWN_VERSIONS.get(api_key)


def _load(loader: Callable[[int, int], type[Any]], api_key: int, version: int) -> type[Any]:
    if known_versions(api_key) is None:
        raise UnknownApiKey(api_key)
    try:
        return loader(api_key, version)
    except KioIndexError:
        raise UnsupportedApiVersion(api_key, version) from None


@functools.cache
def request_class(api_key: int, version: int) -> type[Any]:
    """kio's request class; raises UnknownApiKey / UnsupportedApiVersion."""
    return _load(load_request_schema, api_key, version)


@functools.cache
def response_class(api_key: int, version: int) -> type[Any]:
    """kio's response class; raises UnknownApiKey / UnsupportedApiVersion."""
    return _load(load_response_schema, api_key, version)


@functools.cache
def nested(cls: type[Any], name: str) -> type[Any]:
    """A class defined next to `cls` in the same kio version module, e.g.
    `nested(response_class(3, 12), "MetadataResponseBroker")`. Nested classes differ per version,
    so version-generic handlers look them up from the top-level class they already have."""
    found = getattr(sys.modules[cls.__module__], name, None)
    if not isinstance(found, type):
        raise AttributeError(f"{cls.__module__} has no class {name!r}")
    return found


# --------------------------------------------------------------------------------------------
# make(): version-generic construction
# --------------------------------------------------------------------------------------------


class _Shape(NamedTuple):
    names: frozenset[str]
    timedeltas: frozenset[str]  # fields kio wants as datetime.timedelta (throttle_time, timeouts)
    error_codes: frozenset[str]


@functools.cache
def _shape(cls: type[Any]) -> _Shape:
    fields = dataclasses.fields(cls)
    kinds = {f.name: f.metadata.get("kafka_type") for f in fields}
    return _Shape(
        names=frozenset(kinds),
        timedeltas=frozenset(n for n, k in kinds.items() if k in ("timedelta_i32", "timedelta_i64")),
        error_codes=frozenset(n for n, k in kinds.items() if k == "error_code"),
    )


def make(cls: type[T], /, **kwargs: Any) -> T:
    """Build `cls(**kwargs)`, dropping kwargs this version's class does not have.

    One handler can then serve every version: pass the union of the fields of all versions and
    each class keeps what it knows. Plain ints are accepted for millisecond durations and for
    error codes (converted to the timedelta / ErrorCode kio's writer needs). Fields a version
    requires but that were not passed still raise TypeError, as they should.
    """
    shape = _shape(cls)
    if not kwargs.keys() <= shape.names:
        kwargs = {k: v for k, v in kwargs.items() if k in shape.names}
    for name in shape.timedeltas:
        value = kwargs.get(name)
        if isinstance(value, int):
            kwargs[name] = datetime.timedelta(milliseconds=value)
    for name in shape.error_codes:
        value = kwargs.get(name)
        if type(value) is int:
            kwargs[name] = ErrorCode(value)
    return cls(**kwargs)


# --------------------------------------------------------------------------------------------
# The length guard (see module docstring)
# --------------------------------------------------------------------------------------------


class _Invalid(Exception):
    pass


# A step reads one field at `pos` and returns the position after it. It may overshoot the end
# of the buffer on garbage; the next read then raises IndexError/struct.error, or the final
# bounds check catches it. `budget` is a one-item list: array elements the request may still
# declare (see MAX_ELEMENTS).
_Step = Callable[[bytes, int, list[int]], int]

# Array elements one request may contain in total. Bounding lengths by the bytes left (what
# Kafka does since CVE-2022-34917) still lets a 100 MiB frame declare ~100 M one-byte elements:
# minutes of guard loop on the event loop and GiBs of Python objects from kio. Real requests
# stay far below this (a fetch of every partition of a 100k-partition cluster is ~100k).
MAX_ELEMENTS = 1_000_000

_FIXED_SIZES = {
    "int8": 1, "uint8": 1, "bool": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}  # fmt: skip


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    for shift in (0, 7, 14, 21, 28):
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
    raise _Invalid("unsigned varint longer than 5 bytes")


def _skip(n: int) -> _Step:
    return lambda buf, pos, budget: pos + n


def _compact_var(buf: bytes, pos: int, budget: list[int]) -> int:
    # compact string/bytes: uvarint (length + 1), 0 = null
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = _uvarint(buf, pos)
    return pos + n - 1 if n else pos


def _legacy_string(buf: bytes, pos: int, budget: list[int]) -> int:
    n = _I16.unpack_from(buf, pos)[0]
    if n < -1:
        raise _Invalid("negative string length")
    return pos + 2 + max(n, 0)


def _legacy_bytes(buf: bytes, pos: int, budget: list[int]) -> int:
    n = _I32.unpack_from(buf, pos)[0]
    if n < -1:
        raise _Invalid("negative bytes length")
    return pos + 4 + max(n, 0)


def _primitive_step(kafka_type: str, flexible: bool) -> tuple[_Step | None, int]:
    """(step, fixed_size): a fixed-size type has no step, only a size."""
    if kafka_type in _FIXED_SIZES:
        return None, _FIXED_SIZES[kafka_type]
    if kafka_type == "string":
        return (_compact_var if flexible else _legacy_string), 0
    if kafka_type in ("bytes", "records"):
        return (_compact_var if flexible else _legacy_bytes), 0
    raise TypeError(f"no length guard for kafka type {kafka_type!r}")


def _array_step(flexible: bool, element: _Step | None, element_size: int, min_element: int) -> _Step:
    min_element = max(min_element, 1)

    def array(buf: bytes, pos: int, budget: list[int]) -> int:
        if flexible:
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = _uvarint(buf, pos)
            if n == 0:
                return pos  # null array
            n -= 1
        else:
            n = _I32.unpack_from(buf, pos)[0]
            pos += 4
            if n < 0:
                if n == -1:
                    return pos
                raise _Invalid("negative array length")
        if n * min_element > len(buf) - pos:
            raise _Invalid(f"array claims {n} elements with {len(buf) - pos} bytes left")
        budget[0] -= n
        if budget[0] < 0:
            raise _Invalid(f"more than {MAX_ELEMENTS} array elements in one request")
        if element is None:
            return pos + n * element_size
        for _ in range(n):
            pos = element(buf, pos, budget)
        return pos

    return array


class _Guard(NamedTuple):
    step: _Step
    min_size: int  # the fewest bytes one value can occupy (bounds array lengths)


@functools.cache
def _entity_guard(cls: type[Any], nullable: bool) -> _Guard:
    flexible: bool = cls.__flexible__
    steps: list[_Step] = []
    tagged: dict[int, _Step] = {}
    pending_skip = 0
    min_size = 0
    for field in dataclasses.fields(cls):
        tag = get_field_tag(field)
        step, size, fmin = _field_guard(field, flexible, is_tag=tag is not None)
        if tag is not None:
            tagged[int(tag)] = step if step is not None else _skip(size)
            continue
        min_size += fmin
        if step is None:
            pending_skip += size
            continue
        if pending_skip:
            steps.append(_skip(pending_skip))
            pending_skip = 0
        steps.append(step)
    if pending_skip:
        steps.append(_skip(pending_skip))
    if flexible:
        steps.append(_tagged_fields_step(tagged))
        min_size += 1
    body = _sequence(steps)
    if not nullable:
        return _Guard(body, min_size)

    def nullable_struct(buf: bytes, pos: int, budget: list[int]) -> int:
        if buf[pos] == 0xFF:  # int8 -1 marks a null struct (KIP-893)
            return pos + 1
        return body(buf, pos + 1, budget)

    return _Guard(nullable_struct, 1)


def _sequence(steps: list[_Step]) -> _Step:
    if len(steps) == 1:
        return steps[0]
    frozen = tuple(steps)

    def run(buf: bytes, pos: int, budget: list[int]) -> int:
        for step in frozen:
            pos = step(buf, pos, budget)
        return pos

    return run


def _tagged_fields_step(tagged: dict[int, _Step]) -> _Step:
    def tags(buf: bytes, pos: int, budget: list[int]) -> int:
        count = buf[pos]
        if count == 0:
            return pos + 1
        count, pos = _uvarint(buf, pos)
        if count * 2 > len(buf) - pos:
            raise _Invalid(f"{count} tagged fields with {len(buf) - pos} bytes left")
        for _ in range(count):
            tag, pos = _uvarint(buf, pos)
            _, pos = _uvarint(buf, pos)  # kio reads a known tag by its schema, not by this size
            step = tagged.get(tag)
            if step is None:
                raise _Invalid(f"unknown tagged field {tag}")
            pos = step(buf, pos, budget)
        return pos

    return tags


def _field_guard(
    field: dataclasses.Field[Any], flexible: bool, is_tag: bool
) -> tuple[_Step | None, int, int]:
    """(step or None, fixed size, minimum size) mirroring how kio's native reader reads it."""
    kind = classify_field(field)
    match kind:
        case PrimitiveField():
            step, size = _primitive_step(get_schema_field_type(field), flexible)
            return step, size, size if step is None else 1
        case PrimitiveTupleField():
            element, size = _primitive_step(get_schema_field_type(field), flexible)
            return _array_step(flexible, element, size, size if element is None else 1), 0, 1
        case EntityField(type_=inner):
            compiled = _entity_guard(inner, is_optional(field))
            return compiled.step, 0, compiled.min_size
        case EntityTupleField(type_=inner):
            compiled = _entity_guard(inner, False)
            return _array_step(flexible, compiled.step, 0, compiled.min_size), 0, 1
    raise TypeError(f"unclassifiable field {field.name}")  # pragma: no cover


def validate_lengths(cls: type[Any], buf: bytes, offset: int = 0) -> int:
    """Walk `buf[offset:]` as an instance of `cls`; return the end position.

    Raises ValueError when a length prefix cannot be right (array longer than the bytes left,
    string past the end, unknown tag, over-long varint) or the request declares more than
    MAX_ELEMENTS array elements.
    """
    try:
        end = _entity_guard(cls, False).step(buf, offset, [MAX_ELEMENTS])
    except (_Invalid, IndexError, struct.error) as e:
        raise ValueError(str(e) or "truncated") from None
    if end > len(buf):
        raise ValueError("truncated")
    return end


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


class _Reader(NamedTuple):
    cls: type[Any]
    guard: _Step
    read: Callable[[bytes, int], tuple[Any, int]]


_request_readers: dict[tuple[int, int], _Reader] = {}
_response_readers: dict[tuple[int, int], _Reader] = {}


def _reader(cache: dict[tuple[int, int], _Reader], cls: type[Any]) -> _Reader:
    entry = _Reader(cls, _entity_guard(cls, False).step, entity_reader(cls))
    cache[(cls.__api_key__, cls.__version__)] = entry
    return entry


def _decode(entry: _Reader, api_key: int, version: int, payload: bytes | memoryview, offset: int) -> Any:
    try:
        if entry.guard(payload, offset, [MAX_ELEMENTS]) > len(payload):
            raise _Invalid("truncated")
        value, _ = entry.read(payload, offset)
    except (_Invalid, IndexError, struct.error) as e:
        raise MalformedRequest(api_key, version, str(e) or "truncated") from None
    except Exception as e:  # kio raises ValueError, KeyError, its DecodeError family, …
        raise MalformedRequest(api_key, version, f"{type(e).__name__}: {e}") from None
    # Trailing bytes are ignored, as Kafka does (RequestContext parses and never checks them).
    return value


def decode_request(api_key: int, version: int, payload: bytes | memoryview, offset: int) -> Any:
    """Decode the body starting at `offset` (after the header). `payload` must be read-only:
    `bytes` or a read-only memoryview (kio's reader refuses writable buffers); the result keeps
    no reference to it (records are copied into `bytes`). Raises UnknownApiKey,
    UnsupportedApiVersion or MalformedRequest; never lets garbage reach the native reader
    unchecked."""
    entry = _request_readers.get((api_key, version))
    if entry is None:
        entry = _reader(_request_readers, request_class(api_key, version))
    return _decode(entry, api_key, version, payload, offset)


def decode_response(api_key: int, version: int, payload: bytes | bytearray) -> tuple[int, Any]:
    """(correlation_id, response) from a response frame without its size prefix (client side:
    tests, tools). An ApiVersions UNSUPPORTED_VERSION answer is v0-shaped whatever version was
    asked for, as Kafka sends it."""
    if not isinstance(payload, bytes):
        payload = bytes(payload)  # kio's reader takes read-only buffers only
    correlation_id = _I32.unpack_from(payload, 0)[0]
    cls = response_class(api_key, version)
    if api_key == 18 and len(payload) >= 6 and _I16.unpack_from(payload, 4)[0] == ErrorCode.unsupported_version:
        cls = response_class(18, 0)
    offset = 4 + (1 if cls.__header_schema__.__version__ >= 1 else 0)
    entry = _response_readers.get((cls.__api_key__, cls.__version__)) or _reader(_response_readers, cls)
    return correlation_id, _decode(entry, cls.__api_key__, cls.__version__, payload, offset)


# --------------------------------------------------------------------------------------------
# Encoding
#
# kio's writer is pure Python and generic (one call and one BytesIO write per primitive, a
# temporary BytesIO per entity for its tags): ~20 µs for a one-partition ProduceResponse.
# The encoder below is compiled once per class from the same field metadata, packs runs of
# fixed-size fields with one struct call and appends to a single bytearray. Its output is
# byte-identical to kio's writer for every schema (tests/test_protocol.py checks all of them).
# --------------------------------------------------------------------------------------------

_Encoder = Callable[[bytearray, Any], None]

_STRUCT_CODES = {
    "int8": "b", "int16": "h", "int32": "i", "int64": "q",
    "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q",
    "float64": "d", "bool": "?", "error_code": "h",
}  # fmt: skip
_I64 = struct.Struct(">q")
_ONE_BYTE_VARINTS = tuple(bytes((i,)) for i in range(128))
_ZERO_UUID = bytes(16)
_NOT_NULL = 1  # KIP-893 marker before a non-null nullable struct; null is -1 (0xFF)


def _varint_bytes(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


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
            out += _varint_bytes(len(value) + 1)
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
        out += _varint_bytes(n + 1) if flexible else _I32.pack(n)
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
    prepared = [(_varint_bytes(tag), name, encode, default) for tag, name, encode, default in sorted(tagged)]

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
        out += _varint_bytes(len(present))
        for tag_bytes, body in present:
            out += tag_bytes
            out += _varint_bytes(len(body))
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
