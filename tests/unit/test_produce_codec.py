"""The hand-written Produce codec against kio, for every version the broker registers (0-12; v12 is v11 on the wire).

Requests: whatever kio encodes, read_produce_request reads back field for field; truncated or
inconsistent bytes give MalformedRequest and nothing else. Responses: encode_produce_response gives
the very bytes the broker sent when it built the response with kio (before session 9).
"""

from __future__ import annotations

import datetime
import struct
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.acceptor.handlers.common import NO_THROTTLE, make, to_datetime
from kafscale.broker.results import ProduceResult
from kafscale.protocol.codec import decode_response, encode_request, encode_response, request_class, response_class
from kafscale.protocol.errors import ErrorCode, MalformedRequest
from kafscale.protocol.guard import MAX_ELEMENTS
from kafscale.protocol.header import parse_request_header
from kafscale.protocol.produce_codec import encode_produce_response, read_produce_request
from kafscale.protocol.varint import varint_bytes

VERSIONS = range(0, 13)

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=20)
partitions = st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.none() | st.binary(max_size=300)),
                      max_size=4)
requests = st.fixed_dictionaries({
    "transactional_id": st.none() | names,
    "acks": st.integers(-(2**15), 2**15 - 1),
    "timeout_ms": st.integers(0, 2**31 - 1),
    "topics": st.lists(st.tuples(names, partitions), max_size=4),
})


def _kio_request(version: int, spec: dict[str, Any]) -> bytes:
    cls = request_class(0, version)
    mod = sys.modules[cls.__module__]
    topics = tuple(
        make(mod.TopicProduceData, name=name, partition_data=tuple(
            make(mod.PartitionProduceData, index=index, records=records) for index, records in parts))
        for name, parts in spec["topics"])
    fields: dict[str, Any] = {"acks": spec["acks"], "timeout": datetime.timedelta(milliseconds=spec["timeout_ms"]),
                              "topic_data": topics}
    if version >= 3:
        fields["transactional_id"] = spec["transactional_id"]
    return encode_request(make(cls, **fields), 42)[4:]


def _read(version: int, payload: bytes) -> Any:
    header = parse_request_header(payload)
    return read_produce_request(0, version, payload, header.size)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None)
@given(spec=requests)
def test_reads_every_request_kio_writes(version: int, spec: dict[str, Any]) -> None:
    req = _read(version, _kio_request(version, spec))
    assert req.transactional_id == (spec["transactional_id"] if version >= 3 else None)
    assert (req.acks, req.timeout_ms) == (spec["acks"], spec["timeout_ms"])
    got = [(t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
           for t in req.topic_data]
    assert got == [(name, list(parts)) for name, parts in spec["topics"]]
    for topic in req.topic_data:
        for part in topic.partition_data:
            assert part.records is None or isinstance(part.records, bytearray)  # the owner patches it in place


def test_records_are_a_private_copy_of_a_memoryview_payload() -> None:
    """The listener hands large frames out as a read-only view of a pooled buffer that is reused after."""
    spec = {"transactional_id": None, "acks": -1, "timeout_ms": 30_000, "topics": [("t", [(0, b"abc")])]}
    buffer = bytearray(_kio_request(9, spec))
    req = _read(9, memoryview(buffer).toreadonly())
    buffer[:] = bytes(len(buffer))
    assert req.topic_data[0].partition_data[0].records == bytearray(b"abc")


@pytest.mark.parametrize("version", [3, 8, 9, 11, 12])
def test_every_truncation_is_a_malformed_request(version: int) -> None:
    spec = {"transactional_id": "tx", "acks": 1, "timeout_ms": 100,
            "topics": [("topic", [(0, b"records"), (1, None)]), ("other", [(7, b"")])]}
    payload = _kio_request(version, spec)
    offset = parse_request_header(payload).size
    for end in range(offset, len(payload)):
        with pytest.raises(MalformedRequest):
            read_produce_request(0, version, payload[:end], offset)


def _body(version: int, *parts: bytes) -> tuple[bytes, int]:
    """A header for Produce `version`, then the given body bytes."""
    header = _kio_request(version, {"transactional_id": None, "acks": 1, "timeout_ms": 1, "topics": []})
    offset = parse_request_header(header).size
    return header[:offset] + b"".join(parts), offset


def test_an_array_longer_than_the_bytes_left_is_refused_before_any_element_is_read() -> None:
    payload, offset = _body(8, struct.pack(">hhii", -1, 1, 1, 2**31 - 1))
    with pytest.raises(MalformedRequest, match="truncated"):
        read_produce_request(0, 8, payload, offset)


def test_a_request_may_declare_at_most_max_elements_in_total() -> None:
    # One topic, then MAX_ELEMENTS partitions, which the bytes left could hold: one element too many.
    topic = varint_bytes(2) + b"t" + varint_bytes(MAX_ELEMENTS + 1)
    payload, offset = _body(9, b"\x00", struct.pack(">hi", 1, 1), varint_bytes(2), topic,
                            bytes(MAX_ELEMENTS + 16))
    with pytest.raises(MalformedRequest, match="array elements"):
        read_produce_request(0, 9, payload, offset)


@pytest.mark.parametrize(("version", "body", "reason"), [
    (8, struct.pack(">hhii", -1, 1, 1, -1), "null topic_data"),
    (9, b"\x00" + struct.pack(">hi", 1, 1) + b"\x00", "null topic_data"),
    (8, struct.pack(">hhiih", -1, 1, 1, 1, -1), "null topic name"),
    (8, struct.pack(">hhih", -2, 1, 1, 0), "negative transactional id length"),
    (8, struct.pack(">hhiih", -1, 1, 1, 1, 1) + b"t" + struct.pack(">iii", 1, 0, -2), "negative records length"),
    (8, struct.pack(">hhiih", -1, 1, 1, 1, 1) + b"\xff" + struct.pack(">i", 0), "utf-8"),
    (9, b"\x00" + struct.pack(">hi", 1, 1) + varint_bytes(2) + varint_bytes(0x8001) + b"t" * 0x8000 + b"\x01\x00",
     "topic name of 32768 bytes is longer than a string may be"),
])
def test_inconsistent_fields_are_malformed_requests_that_name_the_field(version: int, body: bytes,
                                                                        reason: str) -> None:
    payload, offset = _body(version, body)
    with pytest.raises(MalformedRequest, match=reason):
        read_produce_request(0, version, payload, offset)


@pytest.mark.parametrize("version", [3, 8, 9, 11, 12])
@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200))
def test_any_bytes_read_as_a_request_or_a_malformed_request(version: int, body: bytes) -> None:
    payload, offset = _body(version, body)
    try:
        req = read_produce_request(0, version, payload, offset)
    except MalformedRequest:
        return
    assert all(isinstance(t.name, str) for t in req.topic_data)


def test_unknown_tagged_fields_are_skipped_and_trailing_bytes_ignored() -> None:
    tags = varint_bytes(2) + varint_bytes(5) + varint_bytes(3) + b"xyz" + varint_bytes(9) + varint_bytes(0)
    partition = struct.pack(">i", 4) + varint_bytes(3) + b"ab" + tags
    topic = varint_bytes(2) + b"t" + varint_bytes(2) + partition + tags
    payload, offset = _body(9, b"\x00", struct.pack(">hi", -1, 500), varint_bytes(2), topic, tags, b"trailing")
    req = read_produce_request(0, 9, payload, offset)
    assert (req.acks, req.timeout_ms) == (-1, 500)
    assert [(t.name, [(p.index, bytes(p.records or b"")) for p in t.partition_data]) for t in req.topic_data] == [
        ("t", [(4, b"ab")])]


# ------------------------------------------------------------------------------------ responses

results = st.one_of(
    st.fixed_dictionaries({
        "error": st.just(0), "base_offset": st.integers(0, 2**62),
        "log_append_time": st.just(-1) | st.integers(0, 253_402_300_799).map(lambda s: s * 1000),  # to year 9999
        "log_start_offset": st.integers(-1, 2**62), "message": st.none(),
    }).map(lambda d: ProduceResult(**d)),
    st.fixed_dictionaries({
        "error": st.sampled_from([int(ErrorCode.request_timed_out), int(ErrorCode.not_leader_or_follower),
                                  int(ErrorCode.corrupt_message)]),
        "message": st.none() | names,
    }).map(lambda d: ProduceResult(**d)),
)
response_topics = st.lists(st.tuples(names, st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), results),
                                                      max_size=4)), max_size=4)


def _kio_response(version: int, correlation_id: int, topics: list[Any]) -> bytes:
    """The response as the broker built it with kio up to session 8."""
    mod = sys.modules[response_class(0, version).__module__]
    built = []
    for name, parts in topics:
        partitions = []
        for index, r in parts:
            fields: dict[str, Any] = {"index": index, "error_code": ErrorCode(r.error),
                                      "base_offset": r.base_offset if r.error == 0 else -1}
            if version >= 2:
                fields["log_append_time"] = to_datetime(r.log_append_time)
            if version >= 5:
                fields["log_start_offset"] = r.log_start_offset
            if version >= 8:
                fields["record_errors"] = ()
                fields["error_message"] = r.message if r.error else None
            partitions.append(make(mod.PartitionProduceResponse, **fields))
        built.append(make(mod.TopicProduceResponse, name=name, partition_responses=tuple(partitions)))
    top: dict[str, Any] = {"responses": tuple(built)}
    if version >= 1:
        top["throttle_time"] = NO_THROTTLE
    return bytes(encode_response(correlation_id, make(mod.ProduceResponse, **top)))


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None)
@given(topics=response_topics, correlation_id=st.integers(-(2**31), 2**31 - 1))
def test_responses_are_the_bytes_kio_wrote(version: int, topics: list[Any], correlation_id: int) -> None:
    encoded = encode_produce_response(version, correlation_id, topics)
    assert (encoded.api_key, encoded.api_version) == (0, version)
    assert bytes(encoded.frame) == _kio_response(version, correlation_id, topics)
    got_id, decoded = decode_response(0, version, encoded.frame[4:])
    assert got_id == correlation_id
    assert [(t.name, [p.index for p in t.partition_responses]) for t in decoded.responses] == [
        (name, [index for index, _ in parts]) for name, parts in topics]
