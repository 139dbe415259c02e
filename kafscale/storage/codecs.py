"""Kafka's record compression codecs: the records section of a v2 batch, in and out.

Read as the Java client writes them (snappy in xerial's stream framing, lz4 in KIP-57 frames) and as librdkafka
writes them (raw snappy); written the plain way every client reads.
"""

from __future__ import annotations

import struct

import cramjam

from kafscale.storage.batch import Buffer

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = range(5)
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic, then i32 version and i32 minimum compatible version


def decompress(codec: int, payload: Buffer) -> bytes:
    """The records section of a batch, uncompressed."""
    if codec == CODEC_NONE:
        return bytes(payload)
    if codec == CODEC_GZIP:
        return bytes(cramjam.gzip.decompress(payload))
    if codec == CODEC_SNAPPY:
        view = memoryview(payload)
        if view[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
            return bytes(cramjam.snappy.decompress_raw(view))
        # The Java client's snappy stream (xerial): a 16-byte header, then [i32 length][raw snappy block]...
        out = []
        at = _XERIAL_HEADER
        while at < len(view):
            (size,) = struct.unpack_from(">i", view, at)
            out.append(bytes(cramjam.snappy.decompress_raw(view[at + 4 : at + 4 + size])))
            at += 4 + size
        return b"".join(out)
    if codec == CODEC_LZ4:
        return bytes(cramjam.lz4.decompress(payload))  # KIP-57 frames, independent blocks
    if codec == CODEC_ZSTD:
        return bytes(cramjam.zstd.decompress(payload))
    raise ValueError(f"unknown compression codec {codec}")


def compress(codec: int, data: Buffer) -> bytes:
    """`data` (a batch's records) compressed with `codec`, as decompress reads it back."""
    if codec == CODEC_NONE:
        return bytes(data)
    if codec == CODEC_GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == CODEC_SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == CODEC_LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == CODEC_ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec {codec}")
