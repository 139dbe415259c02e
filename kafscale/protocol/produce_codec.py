"""Produce v0-v12 requests and responses, read and written by hand (no kio). v12 is v11 on the wire.

Produce is the one API a broker serves thousands of times a second, and librdkafka sends one request
per partition and linger (~64 KB each at 1 KiB records). Through the generic path (the guard's walk, kio's
reader, kio's dataclasses for the response, the schema-driven encoder) a request cost ~30 µs of
decoding and encoding on top of the work itself. The schema is small and stable, so here it is written
out: one pass over the request that copies each partition's records once, straight into the bytearray
the partition owner takes over, and a response packed with struct. `tests/unit/test_produce_codec.py`
checks both against kio for every version.

Request, by version (Kafka's ProduceRequest.json; v9+ are flexible: compact strings, arrays and
bytes, a tagged-field section after every struct):
    transactional_id nullable string (v3+), acks int16, timeout_ms int32,
    topic_data [name string, partition_data [index int32, records nullable bytes]]
Response:
    responses [name string, partition_responses [index int32, error_code int16, base_offset int64,
    log_append_time_ms int64 (v2+), log_start_offset int64 (v5+), record_errors [] (v8+),
    error_message nullable string (v8+)]], throttle_time_ms int32 (v1+)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from kafscale.protocol.errors import MalformedRequest
from kafscale.protocol.guard import MAX_ELEMENTS
from kafscale.protocol.varint import VarintError, read_uvarint, varint_bytes

__all__ = [
    "API_KEY",
    "FIRST_FLEXIBLE_VERSION",
    "EncodedResponse",
    "PartitionData",
    "ProduceRequestData",
    "TopicData",
    "encode_produce_response",
    "read_produce_request",
]

API_KEY = 0
FIRST_FLEXIBLE_VERSION = 9

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_SIZE_CORRELATION = struct.Struct(">ii")
_PARTITION_V0 = struct.Struct(">ihq")  # index, error, base offset
_PARTITION_V2 = struct.Struct(">ihqq")  # + log append time
_PARTITION_V5 = struct.Struct(">ihqqq")  # + log start offset
_EMPTY_ARRAY = b"\x00\x00\x00\x00"
_NULL_STRING = b"\xff\xff"


@dataclass(slots=True)
class PartitionData:
    index: int
    records: bytearray | None  # a private copy: the partition owner patches it in place


@dataclass(slots=True)
class TopicData:
    name: str
    partition_data: list[PartitionData]


@dataclass(slots=True)
class ProduceRequestData:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicData]


@dataclass(slots=True)
class EncodedResponse:
    """A response frame already encoded by its API's own codec (size prefix and header included)."""

    api_key: int
    api_version: int
    frame: bytearray


class _Truncated(Exception):
    pass


class _Reader:
    __slots__ = ("buf", "elements", "end", "flexible", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int, flexible: bool) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf)
        self.flexible = flexible
        self.elements = MAX_ELEMENTS  # the guard's budget: what one request may declare in total

    def take(self, n: int) -> int:
        """Advance over n bytes; returns where they start."""
        start = self.pos
        if n < 0 or start + n > self.end:
            raise _Truncated
        self.pos = start + n
        return start

    def uvarint(self) -> int:
        pos = self.pos
        if pos < self.end and (first := self.buf[pos]) < 0x80:  # lengths and counts below 128: one byte
            self.pos = pos + 1
            return first
        value, self.pos = read_uvarint(self.buf, pos, self.end)
        return value

    def length(self, legacy: struct.Struct) -> int:
        """A string/bytes length (-1: null) or array count (-1: null), in this version's encoding."""
        if self.flexible:
            return self.uvarint() - 1
        return int(legacy.unpack_from(self.buf, self.take(legacy.size))[0])

    def count(self, what: str) -> int:
        n = self.length(_I32)
        if n < 0:
            raise ValueError(f"null {what} array")
        if n > self.end - self.pos:  # every element takes at least one byte
            raise _Truncated
        self.elements -= n
        if self.elements < 0:
            raise ValueError(f"more than {MAX_ELEMENTS} array elements")
        return n

    def string(self, what: str) -> str | None:
        n = self.length(_I16)
        if n < -1:
            raise ValueError(f"negative {what} length {n}")
        if n > 0x7FFF:  # what an int16 length allows; Kafka's readers refuse longer compact strings too
            raise ValueError(f"{what} of {n} bytes is longer than a string may be")
        if n == -1:
            return None
        start = self.take(n)
        return str(self.buf[start : start + n], "utf-8")

    def tags(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()  # tag: Produce defines none, so every one is skipped
                self.take(self.uvarint())


def read_produce_request(api_key: int, version: int, payload: bytes | memoryview, offset: int) -> ProduceRequestData:
    """The Produce request body at payload[offset:]; raises MalformedRequest for bytes that are not one.
    The same signature as codec.decode_request, so the listener can use either."""
    r = _Reader(payload, offset, version >= FIRST_FLEXIBLE_VERSION)
    try:
        transactional_id = r.string("transactional id") if version >= 3 else None
        acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(payload, r.take(_ACKS_TIMEOUT.size))
        topics = []
        for _ in range(r.count("topic_data")):
            name = r.string("topic name")
            if name is None:
                raise ValueError("null topic name")
            partitions = []
            for _ in range(r.count("partition_data")):
                index = _I32.unpack_from(payload, r.take(4))[0]
                n = r.length(_I32)
                if n < -1:
                    raise ValueError(f"negative records length {n}")
                records = None
                if n >= 0:
                    start = r.take(n)
                    records = bytearray(payload[start : start + n])
                r.tags()
                partitions.append(PartitionData(index, records))
            r.tags()
            topics.append(TopicData(name, partitions))
        r.tags()
    except (_Truncated, VarintError, struct.error):
        raise MalformedRequest(api_key, version, "truncated") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise MalformedRequest(api_key, version, str(e)) from None
    # Trailing bytes are ignored, as Kafka does.
    return ProduceRequestData(transactional_id, acks, timeout_ms, topics)


class PartitionAnswer(Protocol):
    """One partition's answer (kafscale.broker.results.ProduceResult has these fields)."""

    error: int
    base_offset: int
    log_append_time: int
    log_start_offset: int
    message: str | None
    record_errors: tuple[tuple[int, str], ...]


# KIP-951 (v10+): for a NOT_LEADER_OR_FOLLOWER partition, its leader (id, epoch), and the leaders' addresses.
Leaders = dict[tuple[str, int], tuple[int, int]]
Endpoints = list[tuple[int, str, int]]  # node id, host, port


def encode_produce_response(version: int, correlation_id: int,
                            topics: list[tuple[str, list[tuple[int, PartitionAnswer]]]],
                            leaders: Leaders | None = None, endpoints: Endpoints | None = None) -> EncodedResponse:
    """The response frame. `topics`: per topic, per partition (index, answer). The base offset is -1 for a
    failed partition, as Kafka sends it. `leaders` and `endpoints` are written as v10+'s tagged fields (only
    when given: librdkafka rejects default-valued tags)."""
    flexible = version >= FIRST_FLEXIBLE_VERSION
    out = bytearray(9 if flexible else 8)  # size and correlation id, + the header's empty tag section
    out += varint_bytes(len(topics) + 1) if flexible else _I32.pack(len(topics))
    partition_struct = _PARTITION_V5 if version >= 5 else _PARTITION_V2 if version >= 2 else _PARTITION_V0
    for name, partitions in topics:
        _string(out, name, flexible)
        out += varint_bytes(len(partitions) + 1) if flexible else _I32.pack(len(partitions))
        for index, result in partitions:
            error = result.error
            fields = [index, error, result.base_offset if error == 0 else -1]
            if version >= 2:
                fields.append(result.log_append_time)
            if version >= 5:
                fields.append(result.log_start_offset)
            out += partition_struct.pack(*fields)
            if version >= 8:
                errors = result.record_errors if error else ()
                out += varint_bytes(len(errors) + 1) if flexible else _I32.pack(len(errors))
                for batch_index, why in errors:
                    out += _I32.pack(batch_index)
                    _string(out, why, flexible)
                    if flexible:
                        out += b"\x00"
                message = result.message if error else None
                if message is None:
                    out += b"\x00" if flexible else _NULL_STRING
                else:
                    _string(out, message, flexible)
            if flexible:
                leader = leaders.get((name, index)) if leaders and version >= 10 else None
                if leader is None:
                    out += b"\x00"
                else:  # one tagged field, tag 0 (CurrentLeader): leader id, leader epoch, no tags
                    out += b"\x01\x00\x09" + _I32.pack(leader[0]) + _I32.pack(leader[1]) + b"\x00"
        if flexible:
            out += b"\x00"
    if version >= 1:
        out += _I32.pack(0)  # throttle_time_ms
    if flexible:
        if endpoints and version >= 10:  # tag 0 (NodeEndpoints): id, host, port, rack (null), no tags
            field = bytearray(varint_bytes(len(endpoints) + 1))
            for node_id, host, port in endpoints:
                field += _I32.pack(node_id)
                _string(field, host, True)
                field += _I32.pack(port) + b"\x00\x00"
            out += b"\x01\x00" + varint_bytes(len(field)) + field
        else:
            out += b"\x00"
    _SIZE_CORRELATION.pack_into(out, 0, len(out) - 4, correlation_id)
    return EncodedResponse(API_KEY, version, out)


def _string(out: bytearray, value: str, flexible: bool) -> None:
    data = value.encode()
    out += varint_bytes(len(data) + 1) if flexible else _I16.pack(len(data))
    out += data
