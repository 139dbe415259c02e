"""The compression framings of Kafka's legacy message sets (magic 0 and 1), in and out, as Kafka writes them.

A compressed legacy message holds a whole inner message set, compressed, as its value. Kafka's Java side frames
two of the codecs in its own way, and old clients expect exactly that:

* snappy: xerial's stream format (a 16-byte header, then [i32 length][raw snappy block] of up to 32 KiB each).
  Readers take raw snappy too (librdkafka, kafka-go write it), as Kafka's xerial input stream does.
* lz4: an LZ4 frame (magic 0x184D2204) with independent 64 KiB blocks and no checksums, as
  `KafkaLZ4BlockOutputStream` writes it. Kafka before 0.10 computed the frame descriptor's header checksum (HC)
  over the frame magic as well as the descriptor (KAFKA-3160); so for magic 0 Kafka writes that broken HC and
  reads any HC without checking it, while for magic 1 the HC must be right.
* gzip: an ordinary gzip stream.

cramjam does the compressing; the frames are put together here. zstd never appears in legacy message sets.
"""

from __future__ import annotations

import struct

import cramjam

from kafscale.storage.batch import Buffer
from kafscale.storage.codecs import CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, decompress

__all__ = ["compress_legacy", "decompress_legacy", "lz4_frame", "xxh32"]

_XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024  # xerial SnappyOutputStream's default block size, which Kafka uses
_LZ4_MAGIC = b"\x04\x22\x4d\x18"  # 0x184D2204, little-endian
_LZ4_FLG = 0x60  # version 01, independent blocks, no block/content checksum, no content size
_LZ4_BD = 0x40  # 64 KiB maximum block size
_LZ4_BLOCK = 64 * 1024
_LZ4_UNCOMPRESSED = 0x80000000  # block size high bit: the block is stored as is
_U32LE = struct.Struct("<I")
_I32 = struct.Struct(">i")

_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393  # XXH32's primes
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: Buffer, seed: int = 0) -> int:
    """XXH32 of fewer than 16 bytes: an LZ4 frame's header checksum hashes at most 18 (the broken HC: magic,
    FLG, BD) and here never more than 6, so the 16-byte stripe loop of longer inputs is left out."""
    data = bytes(data)
    n, i = len(data), 0
    if n >= 16:
        raise ValueError("xxh32 here hashes frame descriptors only (under 16 bytes)")
    h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while i + 4 <= n:
        h = (_rotl((h + _U32LE.unpack_from(data, i)[0] * _P3) & _M32, 17) * _P4) & _M32
        i += 4
    while i < n:
        h = (_rotl((h + data[i] * _P5) & _M32, 11) * _P1) & _M32
        i += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


def _descriptor_length(frame: Buffer) -> int:
    """Bytes of the frame descriptor after the magic, the HC byte included (ValueError if it cannot be one)."""
    if len(frame) < 7 or bytes(frame[:4]) != _LZ4_MAGIC:
        raise ValueError("not an LZ4 frame")
    flg = frame[4]
    return 3 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)  # FLG, BD, [content size], [dict id], HC


def lz4_frame(data: Buffer, broken_checksum: bool) -> bytes:
    """`data` as Kafka's KafkaLZ4BlockOutputStream frames it; broken_checksum: the pre-0.10 HC (for magic 0)."""
    descriptor = bytes((_LZ4_FLG, _LZ4_BD))
    hashed = _LZ4_MAGIC + descriptor if broken_checksum else descriptor
    out = bytearray(_LZ4_MAGIC + descriptor)
    out.append((xxh32(hashed) >> 8) & 0xFF)
    view = memoryview(data)
    for start in range(0, len(view), _LZ4_BLOCK):
        chunk = view[start : start + _LZ4_BLOCK]
        packed = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(packed) >= len(chunk):
            out += _U32LE.pack(len(chunk) | _LZ4_UNCOMPRESSED)
            out += chunk
        else:
            out += _U32LE.pack(len(packed))
            out += packed
    out += b"\x00\x00\x00\x00"  # end mark
    return bytes(out)


def _xerial(data: Buffer) -> bytes:
    out = bytearray(_XERIAL_HEADER)
    view = memoryview(data)
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK]))
        out += _I32.pack(len(block))
        out += block
    return bytes(out)


def compress_legacy(codec: int, magic: int, data: Buffer) -> bytes:
    """An inner message set compressed as Kafka compresses it into a wrapper message of this magic."""
    if codec == CODEC_GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == CODEC_SNAPPY:
        return _xerial(data)
    if codec == CODEC_LZ4:
        return lz4_frame(data, broken_checksum=magic == 0)
    raise ValueError(f"codec {codec} has no legacy framing")


def decompress_legacy(codec: int, magic: int, payload: Buffer) -> bytes:
    """A wrapper message's value, uncompressed. Raises (ValueError or cramjam's errors) on bytes that are not
    that codec's; the caller turns any failure into a refusal of the message."""
    if codec == CODEC_LZ4 and magic == 0:
        # Kafka reads magic 0 frames without checking the HC (it may be the broken one); cramjam checks it, so
        # the right one is put in its place first.
        frame = bytearray(payload)
        end = 4 + _descriptor_length(frame)
        frame[end - 1] = (xxh32(frame[4 : end - 1]) >> 8) & 0xFF
        return bytes(cramjam.lz4.decompress(frame))
    if codec in (CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4):
        return decompress(codec, payload)
    raise ValueError(f"codec {codec} is not one of the legacy message format")
