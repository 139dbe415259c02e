"""Kafka's zigzag varints (records of a v2 batch: lengths, deltas)."""

from __future__ import annotations

from kafscale.storage.batch import Buffer


class VarintError(ValueError):
    """A varint runs past its buffer or past 64 bits."""


def encode(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def decode(buf: Buffer, at: int) -> tuple[int, int]:
    """(value, the position after it)."""
    shift = z = 0
    end = len(buf)
    while True:
        if at >= end or shift > 63:
            raise VarintError(f"varint truncated at byte {at}")
        b = buf[at]
        at += 1
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            return (z >> 1) ^ -(z & 1), at
        shift += 7
