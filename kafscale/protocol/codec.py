"""Request decoding and response encoding with kio, cached per (api_key, version).

Decoding uses kio's native (Rust) reader. That reader sizes every array with
`Vec::with_capacity(length_from_the_wire)` before reading a single element, so one 5-byte varint
claiming 4 billion elements makes it allocate 32 GiB and, when the allocation fails, *abort the
whole process* (Rust's alloc-error handler; no Python exception). A request from any client
could kill the broker. `_LengthGuard` therefore walks the request first, in Python, with the
same schema, and rejects any array whose claimed length cannot fit in the bytes that are left.
It skips strings and record batches by their length prefix without copying, so its cost is a
few microseconds per request whatever the payload size.

Response encoding uses kio's (pure Python) writer; the response header is written here:
v0 (correlation id) for ApiVersions and for non-flexible responses, v1 (plus an empty tag
buffer) for flexible ones — kio's `__header_schema__` on each class already encodes that rule.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
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
    "decode_request",
    "decode_response",
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
# bounds check catches it.
_Step = Callable[[bytes, int], int]

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
    return lambda buf, pos: pos + n


def _compact_var(buf: bytes, pos: int) -> int:
    # compact string/bytes: uvarint (length + 1), 0 = null
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = _uvarint(buf, pos)
    return pos + n - 1 if n else pos


def _legacy_string(buf: bytes, pos: int) -> int:
    n = _I16.unpack_from(buf, pos)[0]
    if n < -1:
        raise _Invalid("negative string length")
    return pos + 2 + max(n, 0)


def _legacy_bytes(buf: bytes, pos: int) -> int:
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

    def array(buf: bytes, pos: int) -> int:
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
        if element is None:
            return pos + n * element_size
        for _ in range(n):
            pos = element(buf, pos)
        return pos

    return array


class _Compiled(NamedTuple):
    step: _Step
    min_size: int  # the fewest bytes one value can occupy (bounds array lengths)


@functools.cache
def _compile_entity(cls: type[Any], nullable: bool) -> _Compiled:
    flexible: bool = cls.__flexible__
    steps: list[_Step] = []
    tagged: dict[int, _Step] = {}
    pending_skip = 0
    min_size = 0
    for field in dataclasses.fields(cls):
        tag = get_field_tag(field)
        step, size, fmin = _compile_field(field, flexible, is_tag=tag is not None)
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
        return _Compiled(body, min_size)

    def nullable_struct(buf: bytes, pos: int) -> int:
        if buf[pos] == 0xFF:  # int8 -1 marks a null struct (KIP-893)
            return pos + 1
        return body(buf, pos + 1)

    return _Compiled(nullable_struct, 1)


def _sequence(steps: list[_Step]) -> _Step:
    if len(steps) == 1:
        return steps[0]
    frozen = tuple(steps)

    def run(buf: bytes, pos: int) -> int:
        for step in frozen:
            pos = step(buf, pos)
        return pos

    return run


def _tagged_fields_step(tagged: dict[int, _Step]) -> _Step:
    def tags(buf: bytes, pos: int) -> int:
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
            pos = step(buf, pos)
        return pos

    return tags


def _compile_field(
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
            compiled = _compile_entity(inner, is_optional(field))
            return compiled.step, 0, compiled.min_size
        case EntityTupleField(type_=inner):
            compiled = _compile_entity(inner, False)
            return _array_step(flexible, compiled.step, 0, compiled.min_size), 0, 1
    raise TypeError(f"unclassifiable field {field.name}")  # pragma: no cover


def validate_lengths(cls: type[Any], buf: bytes, offset: int = 0) -> int:
    """Walk `buf[offset:]` as an instance of `cls`; return the end position.

    Raises ValueError when a length prefix cannot be right (array longer than the bytes left,
    string past the end, unknown tag, over-long varint).
    """
    try:
        end = _compile_entity(cls, False).step(buf, offset)
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
    entry = _Reader(cls, _compile_entity(cls, False).step, entity_reader(cls))
    cache[(cls.__api_key__, cls.__version__)] = entry
    return entry


def _decode(entry: _Reader, api_key: int, version: int, payload: bytes, offset: int) -> Any:
    try:
        if entry.guard(payload, offset) > len(payload):
            raise _Invalid("truncated")
        value, _ = entry.read(payload, offset)
    except (_Invalid, IndexError, struct.error) as e:
        raise MalformedRequest(api_key, version, str(e) or "truncated") from None
    except Exception as e:  # kio raises ValueError, KeyError, its DecodeError family, …
        raise MalformedRequest(api_key, version, f"{type(e).__name__}: {e}") from None
    # Trailing bytes are ignored, as Kafka does (RequestContext parses and never checks them).
    return value


def decode_request(api_key: int, version: int, payload: bytes, offset: int) -> Any:
    """Decode the body starting at `offset` (after the header). `payload` must be `bytes`
    (kio's reader refuses writable buffers). Raises UnknownApiKey, UnsupportedApiVersion or
    MalformedRequest; never lets garbage reach the native reader unchecked."""
    entry = _request_readers.get((api_key, version))
    if entry is None:
        entry = _reader(_request_readers, request_class(api_key, version))
    return _decode(entry, api_key, version, payload, offset)


def decode_response(api_key: int, version: int, payload: bytes) -> tuple[int, Any]:
    """(correlation_id, response) from a response frame without its size prefix (client side:
    tests, tools). An ApiVersions UNSUPPORTED_VERSION answer is v0-shaped whatever version was
    asked for, as Kafka sends it."""
    correlation_id = _I32.unpack_from(payload, 0)[0]
    cls = response_class(api_key, version)
    if api_key == 18 and len(payload) >= 6 and _I16.unpack_from(payload, 4)[0] == ErrorCode.unsupported_version:
        cls = response_class(18, 0)
    offset = 4 + (1 if cls.__header_schema__.__version__ >= 1 else 0)
    entry = _response_readers.get((cls.__api_key__, cls.__version__)) or _reader(_response_readers, cls)
    return correlation_id, _decode(entry, cls.__api_key__, cls.__version__, payload, offset)


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


class _Writer(NamedTuple):
    write: Callable[[Any, Any], None]
    prefix: bytes  # zeroed size + correlation id (+ empty tag buffer for header v1)


_response_writers: dict[type[Any], _Writer] = {}


def _response_writer(cls: type[Any]) -> _Writer:
    header_version = cls.__header_schema__.__version__
    entry = _Writer(entity_writer(cls), bytes(9 if header_version >= 1 else 8))
    _response_writers[cls] = entry
    return entry


def encode_response(correlation_id: int, response: Any) -> bytes:
    """The complete frame (4-byte size, response header, body) for a kio response object.

    The header version follows the response's own class, so an ApiVersions v0 fallback answer
    to a v5 request is framed as v0, which is what Kafka sends.
    """
    cls = type(response)
    entry = _response_writers.get(cls) or _response_writer(cls)
    buf = io.BytesIO()
    buf.write(entry.prefix)
    entry.write(buf, response)
    with buf.getbuffer() as view:
        _SIZE_AND_CORRELATION.pack_into(view, 0, len(view) - 4, correlation_id)
    return buf.getvalue()


def encode_request(request: Any, correlation_id: int, client_id: str | None = "kafscale") -> bytes:
    """The complete frame for a kio request object (client side: tests, tools, benchmarks)."""
    cls = type(request)
    header_version = cls.__header_schema__.__version__
    buf = io.BytesIO()
    buf.write(_REQUEST_HEADER_START.pack(0, cls.__api_key__, cls.__version__, correlation_id))
    if header_version >= 1:
        if client_id is None:
            buf.write(_I16.pack(-1))
        else:
            raw = client_id.encode()
            buf.write(_I16.pack(len(raw)))
            buf.write(raw)
    if header_version >= 2:
        buf.write(b"\x00")  # no tagged fields
    entity_writer(cls)(buf, request)
    with buf.getbuffer() as view:
        _I32.pack_into(view, 0, len(view) - 4)
    return buf.getvalue()
