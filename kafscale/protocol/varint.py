"""Unsigned varints of the flexible protocol versions (lengths, counts, tags): writing and reading."""

from __future__ import annotations

_ONE_BYTE_VARINTS = tuple(bytes((i,)) for i in range(128))


class VarintError(ValueError):
    """A varint that is truncated or longer than 5 bytes."""


def varint_bytes(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_uvarint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at buf[pos:end] and the position after it."""
    result = 0
    for shift in (0, 7, 14, 21, 28):
        if pos >= end:
            raise VarintError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
    raise VarintError("unsigned varint longer than 5 bytes")
