"""The length guard: walks a request with its schema, in Python, before kio's native reader sees it.

kio's native (Rust) reader sizes every array with `Vec::with_capacity(length_from_the_wire)` before
reading a single element, so one 5-byte varint claiming 4 billion elements makes it allocate 32 GiB
and, when the allocation fails, *abort the whole process* (no Python exception): a request from any
client could kill the broker. The guard rejects any array whose claimed length cannot fit in the
bytes that are left. It skips strings and record batches by their length prefix without copying,
so its cost is a few microseconds per request whatever the payload size.

It also finds tagged fields the schema does not know. Kafka ignores those (newer clients may send
tags added to a version after kio's schemas were generated); kio's reader cannot, so the guard
reports them and `without_unknown_tags` cuts them out before decoding.

The guard reads the schemas through two of kio 0.6.2's private helpers (`kio.serial._introspect`)
exactly as kio's reader does; tests/unit/test_protocol.py compares it with kio on every schema.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

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

from kafscale.protocol.varint import VarintError, read_uvarint, varint_bytes

__all__ = ["MAX_ELEMENTS", "GuardError", "check", "validate_lengths"]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class GuardError(ValueError):
    """A length prefix cannot be right, or the request declares too many elements."""


class _Invalid(Exception):
    pass


class _Walk:
    """The state of one walk: elements the request may still declare (see MAX_ELEMENTS), and the
    byte ranges to cut and rewrite so that kio never sees an unknown tagged field."""

    __slots__ = ("cuts", "elements")

    def __init__(self) -> None:
        self.elements = MAX_ELEMENTS
        self.cuts: list[tuple[int, int, bytes]] = []  # (start, end, replacement)


# A step reads one field at `pos` and returns the position after it. It may overshoot the end
# of the buffer on garbage; the next read then raises IndexError/struct.error, or the final
# bounds check catches it.
_Step = Callable[[bytes, int, _Walk], int]

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
    return read_uvarint(buf, pos, len(buf))


def _skip(n: int) -> _Step:
    return lambda buf, pos, walk: pos + n


def _compact_var(buf: bytes, pos: int, walk: _Walk) -> int:
    # compact string/bytes: uvarint (length + 1), 0 = null
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = _uvarint(buf, pos)
    return pos + n - 1 if n else pos


def _legacy_string(buf: bytes, pos: int, walk: _Walk) -> int:
    n = _I16.unpack_from(buf, pos)[0]
    if n < -1:
        raise _Invalid("negative string length")
    return pos + 2 + max(n, 0)


def _legacy_bytes(buf: bytes, pos: int, walk: _Walk) -> int:
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

    def array(buf: bytes, pos: int, walk: _Walk) -> int:
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
        walk.elements -= n
        if walk.elements < 0:
            raise _Invalid(f"more than {MAX_ELEMENTS} array elements in one request")
        if element is None:
            return pos + n * element_size
        for _ in range(n):
            pos = element(buf, pos, walk)
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

    def nullable_struct(buf: bytes, pos: int, walk: _Walk) -> int:
        if buf[pos] == 0xFF:  # int8 -1 marks a null struct (KIP-893)
            return pos + 1
        return body(buf, pos + 1, walk)

    return _Guard(nullable_struct, 1)


def _sequence(steps: list[_Step]) -> _Step:
    if len(steps) == 1:
        return steps[0]
    frozen = tuple(steps)

    def run(buf: bytes, pos: int, walk: _Walk) -> int:
        for step in frozen:
            pos = step(buf, pos, walk)
        return pos

    return run


def _tagged_fields_step(tagged: dict[int, _Step]) -> _Step:
    def tags(buf: bytes, pos: int, walk: _Walk) -> int:
        count = buf[pos]
        if count == 0:
            return pos + 1
        count_at = pos
        count, pos = _uvarint(buf, pos)
        count_end = pos
        if count * 2 > len(buf) - pos:
            raise _Invalid(f"{count} tagged fields with {len(buf) - pos} bytes left")
        unknown = 0
        for _ in range(count):
            field_at = pos
            tag, pos = _uvarint(buf, pos)
            size, pos = _uvarint(buf, pos)
            step = tagged.get(tag)
            if step is None:  # skipped by its size, as Kafka does, and cut out for kio
                pos += size
                if pos > len(buf):
                    raise _Invalid(f"tagged field {tag} runs past the end")
                walk.cuts.append((field_at, pos, b""))
                unknown += 1
                continue
            pos = step(buf, pos, walk)  # kio reads a known tag by its schema, not by its size
        if unknown:
            walk.cuts.append((count_at, count_end, varint_bytes(count - unknown)))
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


def _walk(cls: type[Any], buf: bytes, offset: int) -> tuple[int, _Walk]:
    walk = _Walk()
    try:
        end = _entity_guard(cls, False).step(buf, offset, walk)
    except (_Invalid, VarintError, IndexError, struct.error) as e:
        raise GuardError(str(e) or "truncated") from None
    if end > len(buf):
        raise GuardError("truncated")
    return end, walk


def check(cls: type[Any], buf: bytes, offset: int = 0) -> bytes:
    """Walk `buf[offset:]` as an instance of `cls`. Returns `buf` itself, or a copy without the
    tagged fields the schema does not know. Raises GuardError for lengths that cannot be right."""
    _, walk = _walk(cls, buf, offset)
    if not walk.cuts:
        return buf
    # Each count is recorded after the fields it counts: sorting restores byte order, and no
    # two cuts overlap (a cut field is never walked into).
    out = bytearray()
    pos = 0
    for start, stop, replacement in sorted(walk.cuts):
        out += buf[pos:start]
        out += replacement
        pos = stop
    out += buf[pos:]
    return bytes(out)


def validate_lengths(cls: type[Any], buf: bytes, offset: int = 0) -> int:
    """Walk `buf[offset:]` as an instance of `cls`; return the end position.

    Raises ValueError (GuardError) when a length prefix cannot be right (array longer than the bytes
    left, string past the end, over-long varint) or the request declares more than MAX_ELEMENTS
    array elements.
    """
    return _walk(cls, buf, offset)[0]
