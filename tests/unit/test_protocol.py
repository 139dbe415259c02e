"""The protocol layer without sockets: header parsing, kio codec, make(), the length guard."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata.api_versions import ApiVersionsResponse as KpApiVersionsResponse
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_schema_field_type,
    is_optional,
)

from kafscale.acceptor.handlers.api_versions import api_versions_handler
from kafscale.acceptor.router import RequestContext, Router
from kafscale.protocol import (
    BufferPool,
    ErrorCode,
    FrameAssembler,
    FrameBuffer,
    InvalidFrameSize,
    InvalidRequestHeader,
    MalformedRequest,
    UnknownApiKey,
    UnsupportedApiVersion,
    check_frame_size,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    frame,
    make,
    nested,
    parse_request_header,
    request_class,
    response_class,
)
from kafscale.protocol.codec import MAX_ELEMENTS, encode_entity, validate_lengths
from kafscale.protocol.errors import error_code
from kafscale.protocol.header import request_header_version

# ------------------------------------------------------------------------------- headers


def _header_bytes(api_key: int, version: int, corr: int, client_id: bytes | None, tags: bytes | None) -> bytes:
    out = struct.pack(">hhi", api_key, version, corr)
    if client_id is not None or tags is not None:
        out += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    if tags is not None:
        out += tags
    return out


def test_header_v0_controlled_shutdown():
    payload = _header_bytes(7, 0, 42, None, None) + struct.pack(">i", 5)  # body: broker id
    h = parse_request_header(payload)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id, h.header_version, h.size) == (
        7, 0, 42, None, 0, 8,
    )
    assert decode_request(7, 0, payload, h.size).broker_id == 5


def test_header_v1_with_and_without_client_id():
    h = parse_request_header(_header_bytes(3, 1, 7, b"my-client", None) + b"\xff\xff\xff\xff")
    assert (h.header_version, h.client_id, h.size, h.correlation_id) == (1, "my-client", 8 + 2 + 9, 7)
    h = parse_request_header(_header_bytes(3, 1, -5, None, None) + b"\xff\xff\xff\xff")
    assert (h.client_id, h.size, h.correlation_id) == (None, 10, -5)
    h = parse_request_header(_header_bytes(3, 1, 1, b"", None) + b"\x00\x00\x00\x00")
    assert h.client_id == ""


def test_header_v2_skips_tagged_fields():
    # two tags: tag 0 with 3 bytes, tag 5 with 0 bytes; then a Metadata v9 body
    tags = b"\x02" + b"\x00\x03abc" + b"\x05\x00"
    body = b"\x01" + b"\x00" + b"\x00" + b"\x00" + b"\x00"  # topics=[], auto_create, 2 bools, no tags
    payload = _header_bytes(3, 9, 99, b"c", tags) + body
    h = parse_request_header(payload)
    assert (h.header_version, h.client_id, h.size) == (2, "c", 8 + 3 + len(tags))
    req = decode_request(3, 9, payload, h.size)
    assert req.topics == ()


def test_header_v2_null_client_id_no_tags():
    payload = _header_bytes(18, 3, 1, None, b"\x00")
    h = parse_request_header(payload)
    assert (h.client_id, h.size, h.header_version) == (None, 11, 2)


def test_header_matches_kio_header_reader():
    for api_key, version in [(0, 3), (0, 9), (1, 12), (3, 1), (3, 12), (18, 3), (18, 0), (19, 5)]:
        payload = _header_bytes(api_key, version, 1234, b"abc", b"\x00" if
                                request_header_version(api_key, version) == 2 else None)
        kio_header = request_class(api_key, version).__header_schema__
        value, size = entity_reader(kio_header)(payload, 0)
        ours = parse_request_header(payload)
        assert (ours.api_key, ours.api_version, ours.correlation_id, ours.client_id, ours.size) == (
            value.request_api_key, value.request_api_version, value.correlation_id, value.client_id, size,
        )


def test_header_version_for_unknown_newer_versions():
    assert request_header_version(18, 99) == 2  # a future ApiVersions is flexible
    assert request_header_version(18, 2) == 1
    assert request_header_version(9999, 0) == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x00\x03\x00\x01\x00\x00",  # shorter than the fixed part
        b"\x00\x03\x00\x01\x00\x00\x00\x01\x00",  # client id length cut
        b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x05ab",  # client id shorter than its length
        b"\x00\x03\x00\x01\x00\x00\x00\x01\xff\xfe",  # negative client id length
        b"\x00\x03\x00\x09\x00\x00\x00\x01\x00\x00",  # v2 header without the tag count
        b"\x00\x03\x00\x09\x00\x00\x00\x01\x00\x00\x01\x00\x09xx",  # tag runs past the end
        b"\x00\x03\x00\x09\x00\x00\x00\x01\x00\x00\xff\xff\xff\xff\xff\x01",  # 6-byte varint
    ],
)
def test_header_rejects_garbage(payload: bytes):
    with pytest.raises(InvalidRequestHeader):
        parse_request_header(payload)


def test_header_invalid_utf8_client_id_is_replaced_not_fatal():
    h = parse_request_header(_header_bytes(3, 1, 1, b"\xff\xfeok", None))
    assert h.client_id is not None and h.client_id.endswith("ok")


# ------------------------------------------------------------------------------- framing


def test_framing():
    assert check_frame_size(struct.pack(">i", 10), 10) == 10
    for size in (-1, 11, -(2**31)):
        with pytest.raises(InvalidFrameSize):
            check_frame_size(struct.pack(">i", size), 10)
    fb = FrameBuffer(max_frame_bytes=100)
    data = frame(b"abc") + frame(b"") + frame(b"x" * 50)
    out: list[bytes] = []
    for i in range(0, len(data), 7):
        out += fb.feed(data[i : i + 7])
    assert out == [b"abc", b"", b"x" * 50] and fb.buffered == 0
    with pytest.raises(InvalidFrameSize):
        fb.feed(struct.pack(">i", 2**31 - 1))


def _feed(assembler: FrameAssembler, data: bytes, rng: random.Random, take: bool = True) -> list[bytes]:
    """Deliver `data` the way a BufferedProtocol transport does: recv_into get_buffer()."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        buf = assembler.get_buffer()
        assert len(buf) > 0
        n = min(len(buf), len(data) - pos, rng.choice([1, 3, 7, 100, 4096, 70000, 1 << 20]))
        buf[:n] = data[pos : pos + n]
        assembler.buffer_updated(n)
        pos += n
        while take and (payload := assembler.next_frame()) is not None:
            out.append(bytes(payload))
    return out


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 5, 100, 4000, 65536, 65537, 200_000, 700_000]), max_size=12),
    seed=st.integers(0, 2**32),
)
def test_frame_assembler_round_trip(sizes: list[int], seed: int):
    rng = random.Random(seed)
    payloads = [rng.randbytes(size) for size in sizes]
    assembler = FrameAssembler(max_frame_bytes=1 << 20)
    got = _feed(assembler, b"".join(frame(p) for p in payloads), rng)
    assert got == payloads and assembler.buffered == 0


def test_frame_assembler_large_frames_are_read_only_views_and_small_ones_bytes():
    assembler = FrameAssembler()
    rng = random.Random(1)
    _feed(assembler, frame(b"s" * 10) + frame(b"L" * 100_000), rng, take=False)
    small, large = assembler.next_frame(), assembler.next_frame()
    assert type(small) is bytes and small == b"s" * 10
    assert isinstance(large, memoryview) and large.readonly and bytes(large) == b"L" * 100_000


def test_frame_assembler_keeps_untaken_frames_and_rejects_bad_sizes():
    assembler = FrameAssembler(max_frame_bytes=1000)
    rng = random.Random(2)
    frames = [frame(bytes([i % 256]) * 900) for i in range(400)]  # 360 KB, more than the scratch buffer
    _feed(assembler, b"".join(frames), rng, take=False)  # a paused consumer takes nothing
    taken = []
    while (payload := assembler.next_frame()) is not None:
        taken.append(payload)
    assert taken == [f[4:] for f in frames]
    _feed(assembler, struct.pack(">i", 1001), rng, take=False)
    with pytest.raises(InvalidFrameSize):
        assembler.next_frame()


def test_large_frame_buffers_are_pooled_and_reused():
    pool = BufferPool(max_idle_bytes=3 * 2**20)
    assembler = FrameAssembler(pool=pool)
    rng = random.Random(3)
    ids = set()
    for i in range(5):
        _feed(assembler, frame(bytes([i]) * 1_000_000), rng, take=False)
        payload = assembler.next_frame()
        assert isinstance(payload, memoryview) and payload[0] == i and len(payload) == 1_000_000
        ids.add(id(payload.obj))
        del payload
    assembler.close()
    assert len(ids) == 1  # one buffer, lent and returned five times
    assert pool.idle_bytes == BufferPool.size_class(1_000_000) <= 3 * 2**20
    # the idle cap holds: a fourth 1 MiB-class buffer is not kept
    buffers = [pool.take(1_000_000) for _ in range(4)]
    for b in buffers:
        pool.give(b)
    assert pool.idle_bytes <= 3 * 2**20
    assert len(pool.take(50 * 2**20)) == 50 * 2**20  # giant requests bypass the pool


# ------------------------------------------------------------------------------- codec


def _produce(version: int, records: bytes = b"batch-bytes") -> Any:
    cls = request_class(0, version)
    return make(
        cls,
        transactional_id=None,
        acks=-1,
        timeout=1500,
        topic_data=(
            make(
                nested(cls, "TopicProduceData"),
                name="topic-a",
                partition_data=(make(nested(cls, "PartitionProduceData"), index=3, records=records),),
            ),
        ),
    )


@pytest.mark.parametrize("version", [0, 3, 8, 9, 11])
def test_produce_request_round_trip(version: int):
    req = _produce(version, records=bytes(range(256)) * 64)
    data = encode_request(req, correlation_id=77, client_id="producer-1")
    assert struct.unpack(">i", data[:4])[0] == len(data) - 4
    payload = data[4:]
    h = parse_request_header(payload)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (0, version, 77, "producer-1")
    back = decode_request(0, version, payload, h.size)
    assert back == req
    assert back.timeout == datetime.timedelta(milliseconds=1500)
    assert type(back.topic_data[0].partition_data[0].records) is bytes


@pytest.mark.parametrize(("api_key", "version"), [(1, 4), (1, 12), (1, 17), (3, 1), (3, 12), (18, 3), (19, 7)])
def test_request_round_trip_via_kio_writer(api_key: int, version: int):
    rng = random.Random(api_key * 100 + version)
    cls = request_class(api_key, version)
    req = _random_entity(cls, rng)
    payload = encode_request(req, 5)[4:]
    h = parse_request_header(payload)
    assert decode_request(api_key, version, payload, h.size) == req


def _metadata_response(version: int) -> Any:
    cls = response_class(3, version)
    return make(
        cls,
        throttle_time=0,
        brokers=(make(nested(cls, "MetadataResponseBroker"), node_id=1, host="h", port=9092, rack=None),),
        cluster_id="c1",
        controller_id=1,
        topics=(),
        cluster_authorized_operations=-2147483648,
    )


@pytest.mark.parametrize("version", [0, 1, 8, 9, 12])
def test_response_round_trip_and_header_version(version: int):
    resp = _metadata_response(version)
    data = encode_response(31337, resp)
    assert struct.unpack(">ii", data[:8]) == (len(data) - 4, 31337)
    if version >= 9:  # flexible: response header v1 has an (empty) tag buffer
        assert data[8] == 0
    corr, back = decode_response(3, version, data[4:])
    assert corr == 31337 and back == resp


def test_unknown_and_unsupported():
    with pytest.raises(UnknownApiKey):
        request_class(9999, 0)
    with pytest.raises(UnsupportedApiVersion):
        request_class(0, 99)
    with pytest.raises(UnsupportedApiVersion):
        decode_request(3, 77, b"\x00" * 20, 10)


# ------------------------------------------------------------------------------- make()


def test_make_drops_unknown_kwargs_and_coerces():
    v0 = make(
        response_class(12, 0),
        error_code=27,
        throttle_time=250,
        not_a_field="ignored",
    )
    assert v0.error_code is ErrorCode.rebalance_in_progress
    assert not hasattr(v0, "throttle_time")
    v4 = make(response_class(12, 4), error_code=ErrorCode.none, throttle_time=250, not_a_field=1)
    assert v4.throttle_time == datetime.timedelta(milliseconds=250)
    # one call works for every version of Metadata
    for version in range(0, 13):
        assert _metadata_response(version).brokers[0].port == 9092
    with pytest.raises(TypeError):
        make(response_class(12, 0))  # a required field is missing


def test_nested_lookup():
    assert nested(response_class(3, 12), "MetadataResponseBroker").__module__.endswith("v12.response")
    with pytest.raises(AttributeError):
        nested(response_class(3, 12), "Nope")


def test_error_code_helper():
    assert error_code(6) is ErrorCode.not_leader_or_follower
    assert error_code(31999) is ErrorCode.unknown_server_error


# ------------------------------------------------------------------------------- ApiVersions bytes


async def _api_versions_frame(router: Router, version: int, body: Any) -> bytes:
    ctx = RequestContext(18, version, 11, "t", "127.0.0.1", 1, 1, None)  # type: ignore[arg-type]
    resp = await api_versions_handler(router)(ctx, body)
    return encode_response(11, resp)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
async def test_api_versions_response_decodes_with_kafka_python(version: int):
    router = Router({"transaction.version": 2})

    async def handler(ctx: RequestContext, req: Any) -> Any:
        return None

    router.register(3, 0, 12, handler)
    router.register(0, 3, 9, handler)
    req_cls = request_class(18, version)
    body = req_cls(client_software_name="kcat", client_software_version="1.7.1") if version >= 3 else req_cls()
    data = await _api_versions_frame(router, version, body)
    decoded = KpApiVersionsResponse[version].decode(data, header=True, framed=True)
    assert decoded.error_code == 0
    got = {(k.api_key, k.min_version, k.max_version) for k in decoded.api_keys}
    assert got == {(0, 3, 9), (3, 0, 12), (18, 0, 4)}
    _, resp = decode_response(18, version, data[4:])
    if version >= 3:  # transaction.version: supported 0-2 (left out of v3, its minimum being 0), finalized at 2;
        # group.version: supported 0-1 (also left out of v3), finalized by dispatch's router (not this one)
        supported = [(f.name, f.min_version, f.max_version) for f in resp.supported_features]
        assert supported == ([("transaction.version", 0, 2), ("group.version", 0, 1)] if version >= 4 else [])
        finalized = [(f.name, f.min_version_level, f.max_version_level) for f in resp.finalized_features]
        assert finalized == [("transaction.version", 2, 2)] and resp.finalized_features_epoch == 0
        assert not resp.zk_migration_ready


@pytest.mark.parametrize("level", [0, 1])
async def test_api_versions_finalizes_the_configured_transaction_version(level: int):
    body = request_class(18, 4)(client_software_name="kcat", client_software_version="1.7.1")
    data = await _api_versions_frame(Router({"transaction.version": level}), 4, body)
    _, resp = decode_response(18, 4, data[4:])
    finalized = [(f.name, f.min_version_level, f.max_version_level) for f in resp.finalized_features]
    assert finalized == ([("transaction.version", 1, 1)] if level else [])  # a level 0 feature is not listed


def test_registering_an_api_loads_no_schema_class_until_its_first_request() -> None:
    """A shard's start registers ~40 APIs; importing all their versions' schema modules took 1.9 s of CPU."""
    code = ("import sys\n"
            "from kafscale.acceptor.router import Router\n"
            "async def h(ctx, req): return None\n"
            "Router().register(1, 4, 17, h)\n"
            "print(sorted(m for m in sys.modules if m.startswith('kio.schema.fetch.v')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_registering_a_version_kio_lacks_fails_at_start_up() -> None:
    async def handler(ctx: RequestContext, req: Any) -> Any:
        return None

    with pytest.raises(ValueError, match=r"API key 3: kio has no schemas for versions \[13, 14\]"):
        Router().register(3, 12, 14, handler)


async def test_api_versions_unsupported_version_is_v0_with_own_range():
    router = Router()
    from kafscale.acceptor.handlers.api_versions import UNSUPPORTED_VERSION_REQUEST

    data = await _api_versions_frame(router, 7, UNSUPPORTED_VERSION_REQUEST)
    # v0 body: error 35, one entry (18, 0, 4); v0 header (no tag byte)
    assert data == struct.pack(">iihihhh", 4 + 2 + 4 + 6, 11, 35, 1, 18, 0, 4)
    decoded = KpApiVersionsResponse[4].decode(data, header=True, framed=True)
    assert decoded.error_code == 35 and [(k.api_key, k.max_version) for k in decoded.api_keys] == [(18, 4)]


async def test_api_versions_invalid_software_name():
    router = Router()
    body = request_class(18, 3)(client_software_name="-bad name", client_software_version="1")
    data = await _api_versions_frame(router, 3, body)
    _, resp = decode_response(18, 3, data[4:])
    assert resp.error_code == ErrorCode.invalid_request and resp.api_keys == ()


# ------------------------------------------------------------------------------- length guard

# A value for every kio field kind, to produce valid messages of every schema.
_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1), "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1),
}  # fmt: skip


def _random_primitive(kafka_type: str, rng: random.Random) -> Any:
    if kafka_type in _INT_RANGES:
        return rng.randint(*_INT_RANGES[kafka_type])
    match kafka_type:
        case "bool":
            return rng.random() < 0.5
        case "float64":
            return rng.uniform(-1e6, 1e6)
        case "string":
            return "".join(rng.choice("abcxyzé-_.") for _ in range(rng.randint(0, 12)))
        case "bytes" | "records":
            return rng.randbytes(rng.randint(0, 40))
        case "uuid":
            return uuid.UUID(int=rng.getrandbits(128))
        case "error_code":
            return rng.choice(list(ErrorCode))
        case "timedelta_i32" | "timedelta_i64":
            return datetime.timedelta(milliseconds=rng.randint(0, 10**6))
        case "datetime_i64":
            return datetime.datetime.fromtimestamp(rng.randint(0, 2 * 10**9), tz=datetime.UTC)
    raise AssertionError(kafka_type)


def _random_entity(cls: type[Any], rng: random.Random, depth: int = 0) -> Any:
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        tagged = "tag" in field.metadata
        has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        if tagged and has_default and rng.random() < 0.5:
            continue  # leave the default: not written
        kind = classify_field(field)
        optional = is_optional(field) and not tagged
        if optional and rng.random() < 0.25:
            kwargs[field.name] = None
            continue
        count = rng.randint(0, 3 if depth < 2 else 1)
        match kind:
            case PrimitiveField():
                kwargs[field.name] = _random_primitive(get_schema_field_type(field), rng)
            case PrimitiveTupleField():
                kt = get_schema_field_type(field)
                kwargs[field.name] = tuple(_random_primitive(kt, rng) for _ in range(count))
            case EntityField(type_=inner):
                kwargs[field.name] = _random_entity(inner, rng, depth + 1)
            case EntityTupleField(type_=inner):
                kwargs[field.name] = tuple(_random_entity(inner, rng, depth + 1) for _ in range(count))
    return cls(**kwargs)


def _all_schemas() -> list[type[Any]]:
    out = []
    for key, name in api_key_map.items():
        if name not in schema_name_map:
            continue
        for version in schema_name_map[name]:
            out += [request_class(key, version), response_class(key, version)]
    return out


def test_guard_and_encoder_agree_with_kio_on_every_schema():
    """For random valid messages of every request and response schema kio has, our encoder
    writes exactly kio's bytes, the guard walks exactly the bytes kio's reader consumes, and
    rejects every truncation."""
    rng = random.Random(20261122)
    checked = 0
    for cls in _all_schemas():
        writer = entity_writer(cls)
        reader = entity_reader(cls)
        for _ in range(3):
            value = _random_entity(cls, rng)
            buf = io.BytesIO()
            writer(buf, value)
            data = buf.getvalue()
            assert encode_entity(value) == data, cls
            _, consumed = reader(data, 0)
            assert consumed == len(data)
            assert validate_lengths(cls, data) == len(data), cls
            for cut in {len(data) // 2, len(data) - 1} - {len(data)}:
                if cut >= 0 and len(data):
                    with pytest.raises(ValueError):
                        validate_lengths(cls, data[:cut])
            checked += 1
    assert checked > 1500


def _produce_v9_prefix() -> bytes:
    return _header_bytes(0, 9, 1, b"c", b"\x00")


# Bodies that make kio 0.6.2's native reader allocate tens of GiB and abort the process.
_BOMBS = [
    # Produce v9: null transactional id, acks, timeout, topic_data = compact array of 2^32-2
    (0, 9, b"\x00" + b"\xff\xff" + b"\x00\x00\x03\xe8" + b"\xff\xff\xff\xff\x0f"),
    # Produce v9: one topic, its partition_data claims 2^32-2 entries
    (0, 9, b"\x00" + b"\xff\xff" + b"\x00\x00\x03\xe8" + b"\x02" + b"\x02t" + b"\xff\xff\xff\xff\x0f"),
    # Metadata v1: legacy topics array of 2^31-1
    (3, 1, b"\x7f\xff\xff\xff"),
    # Fetch v4: legacy topics array of 2^31-1 after the fixed fields
    (1, 4, b"\xff\xff\xff\xff" + b"\x00\x00\x01\xf4" + b"\x00\x00\x00\x01" + b"\x00\x10\x00\x00" + b"\x00"
     + b"\x7f\xff\xff\xff"),
]


@pytest.mark.parametrize(("api_key", "version", "body"), _BOMBS)
def test_guard_rejects_array_length_bombs(api_key: int, version: int, body: bytes):
    hdr_version = request_header_version(api_key, version)
    header = _header_bytes(api_key, version, 1, b"c", b"\x00" if hdr_version == 2 else None)
    with pytest.raises(MalformedRequest, match="array claims"):
        decode_request(api_key, version, header + body, len(header))


def test_unknown_tagged_fields_are_ignored_as_kafka_does():
    """Tags a newer client sends that kio's schema lacks are skipped by their size, at the top level
    and inside nested structs, next to known tags that are still read."""
    fetch = request_class(1, 13)
    plain = make(fetch, replica_id=-1, max_wait=datetime.timedelta(milliseconds=5), min_bytes=1, max_bytes=1024,
                 isolation_level=0, session_id=0, session_epoch=-1, topics=(), forgotten_topics_data=(),
                 rack_id="", cluster_id=None)
    body = encode_entity(plain)
    assert body[-1] == 0  # no tags set
    # Top level: known tag 0 (cluster_id = "abc") between two unknown ones (7 and 300).
    tags = b"\x03" + b"\x07\x03xyz" + b"\x00\x04\x04abc" + b"\xac\x02\x01!"
    got = decode_request(1, 13, body[:-1] + tags, 0)
    assert got == dataclasses.replace(plain, cluster_id="abc")

    metadata = request_class(3, 12)
    topic = nested(metadata, "MetadataRequestTopic")
    req = make(metadata, topics=(make(topic, topic_id=uuid.UUID(int=5), name="orders"),),
               allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    body = encode_entity(req)
    tag_at = 1 + 16 + 1 + len("orders")  # array length, topic id, name: then the topic's tags
    assert body[tag_at] == 0
    mutated = body[:tag_at] + b"\x01\x05\x02hi" + body[tag_at + 1 : -1] + b"\x01\x09\x00"
    assert decode_request(3, 12, mutated, 0) == req
    # A skipped tag must still fit in the request.
    with pytest.raises(MalformedRequest):
        decode_request(3, 12, body[:-1] + b"\x01\x09\x7f", 0)


def test_guard_caps_total_array_elements():
    # Metadata v1: MAX_ELEMENTS + 1 empty topic names (2 bytes each) fit the bytes but not the cap
    n = MAX_ELEMENTS + 1
    with pytest.raises(MalformedRequest, match="more than"):
        decode_request(3, 1, struct.pack(">i", n) + b"\x00\x00" * n, 0)
    # OffsetFetch v1: the cap counts primitive array elements too, across topics
    half = MAX_ELEMENTS // 2 + 1
    topic = b"\x00\x01t" + struct.pack(">i", half) + b"\x00\x00\x00\x07" * half
    body = b"\x00\x01g" + struct.pack(">i", 2) + topic + topic
    with pytest.raises(MalformedRequest, match="more than"):
        decode_request(9, 1, body, 0)
    small = b"\x00\x01g" + struct.pack(">i", 1) + b"\x00\x01t" + struct.pack(">i", 3) + b"\x00\x00\x00\x07" * 3
    assert decode_request(9, 1, small, 0).topics[0].partition_indexes == (7, 7, 7)


def test_bomb_would_abort_without_the_guard_and_not_with_it():
    """Documents why the guard exists: kio's reader alone kills the interpreter."""
    api_key, version, body = _BOMBS[0]
    script = textwrap.dedent(
        f"""
        from kafscale.protocol.codec import request_class, decode_request
        from kafscale.protocol.errors import MalformedRequest
        body = {body!r}
        try:
            decode_request({api_key}, {version}, body, 0)
        except MalformedRequest:
            print("guarded")
        from kio.serial import entity_reader
        entity_reader(request_class({api_key}, {version}))(body, 0)
        print("survived")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("guarded")
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if ram < 28 * 2**30:
        # The unguarded read asks for 32 GiB at once; the kernel refuses and Rust aborts.
        assert "survived" not in proc.stdout and proc.returncode == -signal.SIGABRT


_SCHEMA_KEYS = [
    (key, version)
    for key, name in api_key_map.items()
    if name in schema_name_map
    for version in schema_name_map[name]
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_SCHEMA_KEYS), st.binary(max_size=64))
def test_garbage_bodies_raise_malformed_or_decode(key_version: tuple[int, int], body: bytes):
    api_key, version = key_version
    with contextlib.suppress(MalformedRequest):  # anything else (or an abort) fails the test
        decode_request(api_key, version, body, 0)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_valid_requests_never_escape_as_other_errors(data: st.DataObject):
    api_key, version = data.draw(st.sampled_from([(0, 9), (0, 3), (1, 12), (1, 4), (3, 12), (3, 1)]))
    cls = request_class(api_key, version)
    value = _random_entity(cls, random.Random(data.draw(st.integers(0, 10**6))))
    buf = io.BytesIO()
    entity_writer(cls)(buf, value)
    raw = bytearray(buf.getvalue())
    for _ in range(data.draw(st.integers(1, 4))):
        if raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(MalformedRequest):
        decode_request(api_key, version, bytes(raw), 0)


def test_an_api_is_named_without_importing_its_schemas() -> None:
    """Metric labels name every API; importing a v0 schema module to do it cost the first request of each API tens
    of milliseconds (a fresh interpreter: other tests import schemas)."""
    code = ("import sys; from kafscale.protocol.schemas import api_name; "
            "names = [api_name(k) for k in (0, 1, 8, 18, 68, 999)]; "
            "print(names, any(m.startswith('kio.schema.fetch.v') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['Produce', 'Fetch', 'OffsetCommit', 'ApiVersions', 'ConsumerGroupHeartbeat', 'api999'] False"
