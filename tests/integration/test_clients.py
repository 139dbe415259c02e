"""Acceptance matrix: unmodified Kafka clients produce and consume through the broker.

Each of confluent-kafka (librdkafka 2.16), kafka-python (idempotent by default), aiokafka and kcat
(librdkafka 2.0) produces 10,000 keyed records with headers to a 3-partition topic with each codec
(gzip, snappy, lz4, zstd) and consumes them back, on the embedded stores and on etcd + SeaweedFS.
What is checked, for every combination:

* keys, values (binary, some null), headers (repeated names, empty values) and timestamps come back
  byte-identical, each record exactly once;
* per partition, records come back in the order they were produced, with offsets 0, 1, 2, … and the
  partition's end offset equal to its record count; where the client reports where each record went,
  that is where it was found;
* the stored batches really carry the codec asked for (a client could silently send uncompressed),
  and kafka-python's carry a producer id (its idempotent path was used).

Then cross-client: what each client produced is consumed, byte-identical, by every other client.

kcat reads records as lines (`key<TAB>value`), so its records are text without tabs or newlines,
all carry the headers given with -H, and their timestamps are whatever the producer stamped (checked
to lie within the run). Consumed through kcat, key and value are cut by their lengths (%K, %S), so
binary data survives; header values are kept free of ',', '=' and newlines so kcat's %h parses.
"""

from __future__ import annotations

import asyncio
import random
import string
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from kafscale.protocol.errors import ErrorCode
from kafscale.storage.batch import BatchHeader, split_batches
from tests.integration.conftest import Cluster, record_throughput, unique_topic

RECORDS = 10_000
PARTITIONS = 3
CODECS = ["gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka", "kcat"]
LINGER_MS = 20
DEADLINE_S = 120.0
KCAT = "/usr/bin/kcat"

# Timestamps a day in the past, with milliseconds, one apart: distinct and easy to tell apart from
# the broker's clock (which LogAppendTime would put there).
BASE_TIMESTAMP = (int(time.time()) - 86_400) * 1000 + 123


@dataclass(frozen=True, slots=True)
class Record:
    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int | None  # None: the producer stamps it (kcat)


@dataclass(frozen=True, slots=True)
class Consumed:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    create_time: bool | None  # None where the client does not say which kind of timestamp it is


# Where each record went, per producer report: index in the record list -> (partition, offset).
Delivered = dict[int, tuple[int, int]]

_SAFE = (string.ascii_letters + string.digits + "._-").encode()


def _key(i: int) -> bytes:
    return b"key-%05d" % i


def binary_records(n: int, seed: int) -> list[Record]:
    """Binary values (every 97th null, some empty), repeated and empty header values, own timestamps."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        value = None if i % 97 == 0 else _value(rng, rng.randbytes(rng.choice((0, 1, 16, 64))))
        headers = [("seq", b"%d" % i), ("tag", bytes(rng.choices(_SAFE, k=rng.randint(0, 12))))]
        if i % 3 == 0:
            headers.append(("seq", b""))
        out.append(Record(_key(i), value, tuple(headers), BASE_TIMESTAMP + i))
    return out


KCAT_HEADERS: tuple[tuple[str, bytes], ...] = (("trace", b"abc123"), ("trace", b"def"), ("empty", b""))
_LINE_BYTES = bytes(b for b in range(256) if b not in (0x09, 0x0A, 0x0D))  # no tab, newline or CR


def kcat_records(n: int, seed: int) -> list[Record]:
    """What kcat can produce from lines: any bytes but the delimiters, the same headers on all."""
    rng = random.Random(seed)
    return [Record(_key(i), _value(rng, bytes(rng.choices(_LINE_BYTES, k=rng.choice((0, 1, 20, 50))))),
                   KCAT_HEADERS, None) for i in range(n)]


def _value(rng: random.Random, noise: bytes) -> bytes:
    """Random bytes, then sometimes some text: compressible enough that librdkafka, which sends a
    batch uncompressed when compressing does not make it smaller, really compresses."""
    return noise + b"payload text, repeated; " * rng.choice((0, 0, 1, 4, 10))


# ------------------------------------------------------------------------------------ clients


def produce_confluent(bootstrap: str, topic: str, records: list[Record], codec: str) -> Delivered:
    from confluent_kafka import KafkaError, Message, Producer

    delivered: Delivered = {}
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": LINGER_MS,
                         "acks": "all"})

    def report(i: int) -> Callable[[KafkaError | None, Message], None]:
        def done(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                delivered[i] = (msg.partition(), msg.offset())
        return done

    try:
        for i, r in enumerate(records):
            while True:
                try:
                    producer.produce(topic, value=r.value, key=r.key, headers=list(r.headers),
                                     timestamp=r.timestamp or 0, on_delivery=report(i))
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        remaining = producer.flush(DEADLINE_S)
        assert remaining == 0, f"{remaining} records not delivered"
    finally:
        producer.close()
    assert not errors, errors[:5]
    return delivered


def consume_confluent(bootstrap: str, topic: str, expected: int) -> list[Consumed]:
    from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_CREATE_TIME, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kafscale-it-{topic}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    out: list[Consumed] = []
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < expected and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=5000, timeout=0.5):
                if m.error() is not None:
                    raise AssertionError(f"consumer error: {m.error()}")
                kind, ts = m.timestamp()
                out.append(Consumed(m.partition(), m.offset(), m.key(), m.value(),
                                    tuple((k, v) for k, v in (m.headers() or [])), ts, kind == TIMESTAMP_CREATE_TIME))
    finally:
        consumer.close()
    return out


def produce_kafka_python(bootstrap: str, topic: str, records: list[Record], codec: str) -> Delivered:
    from kafka import KafkaProducer

    # enable_idempotence is left at its default (True in kafka-python 3): the broker must serve it.
    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=LINGER_MS,
                             batch_size=128 * 1024, acks="all")
    try:
        futures = [producer.send(topic, key=r.key, value=r.value, headers=list(r.headers), timestamp_ms=r.timestamp)
                   for r in records]
        producer.flush(DEADLINE_S)
        delivered = {}
        for i, f in enumerate(futures):
            meta = f.get(timeout=DEADLINE_S)
            delivered[i] = (meta.partition, meta.offset)
    finally:
        producer.close(timeout=10)
    return delivered


def consume_kafka_python(bootstrap: str, topic: str, expected: int) -> list[Consumed]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100)
    out: list[Consumed] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < expected and time.monotonic() < deadline:
            for tp_records in consumer.poll(timeout_ms=500, max_records=5000).values():
                out += [Consumed(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp,
                                 m.timestamp_type == 0) for m in tp_records]
    finally:
        consumer.close()
    return out


def produce_aiokafka(bootstrap: str, topic: str, records: list[Record], codec: str) -> Delivered:
    from aiokafka import AIOKafkaProducer

    async def run() -> Delivered:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=LINGER_MS,
                                    max_batch_size=128 * 1024, acks="all")
        await producer.start()
        try:
            futures = [await producer.send(topic, key=r.key, value=r.value, headers=list(r.headers),
                                           timestamp_ms=r.timestamp) for r in records]
            metas = await asyncio.wait_for(asyncio.gather(*futures), DEADLINE_S)
        finally:
            await producer.stop()
        return {i: (m.partition, m.offset) for i, m in enumerate(metas)}

    return asyncio.run(run())


def consume_aiokafka(bootstrap: str, topic: str, expected: int) -> list[Consumed]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> list[Consumed]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", fetch_max_wait_ms=100)
        await consumer.start()
        out: list[Consumed] = []
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            deadline = time.monotonic() + DEADLINE_S
            while len(out) < expected and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500, max_records=5000)
                for tp_records in batches.values():
                    out += [Consumed(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp,
                                     m.timestamp_type == 0) for m in tp_records]
        finally:
            await consumer.stop()
        return out

    return asyncio.run(run())


def produce_kcat(bootstrap: str, topic: str, records: list[Record], codec: str) -> None:
    for r in records:
        assert r.headers == KCAT_HEADERS and r.timestamp is None and r.value is not None, "not a kcat record"
    lines = b"".join(r.key + b"\t" + (r.value or b"") + b"\n" for r in records)
    headers = [arg for name, value in KCAT_HEADERS for arg in ("-H", f"{name}={value.decode()}")]
    done = subprocess.run([KCAT, "-P", "-b", bootstrap, "-t", topic, "-K", "\t", "-z", codec, *headers,
                           "-X", f"linger.ms={LINGER_MS}", "-X", "acks=all"],
                          input=lines, capture_output=True, timeout=DEADLINE_S)
    assert done.returncode == 0 and b"fail" not in done.stderr.lower(), done.stderr.decode(errors="replace")


# One record per output line would break on binary values: the lengths (%K, %S) say where key and
# value end, and the headers run to the end of the line.
KCAT_FORMAT = "%p %o %T %K %S %k%s%h\n"


def parse_kcat(out: bytes) -> list[Consumed]:
    result = []
    pos = 0
    while pos < len(out):
        fields = []
        for _ in range(5):
            end = out.index(b" ", pos)
            fields.append(int(out[pos:end]))
            pos = end + 1
        partition, offset, timestamp, key_len, value_len = fields
        key = out[pos:pos + key_len] if key_len >= 0 else None
        pos += max(key_len, 0)
        value = out[pos:pos + value_len] if value_len >= 0 else None
        pos += max(value_len, 0)
        end = out.index(b"\n", pos)
        headers = []
        if end > pos:
            for item in out[pos:end].split(b","):
                name, _, raw = item.partition(b"=")
                headers.append((name.decode(), raw))
        pos = end + 1
        result.append(Consumed(partition, offset, key, value, tuple(headers), timestamp, None))
    return result


def consume_kcat(bootstrap: str, topic: str, expected: int) -> list[Consumed]:
    done = subprocess.run([KCAT, "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q",
                           "-f", KCAT_FORMAT], capture_output=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return parse_kcat(done.stdout)


ProduceFn = Callable[[str, str, list[Record], str], Delivered | None]
ConsumeFn = Callable[[str, str, int], list[Consumed]]

PRODUCERS: dict[str, ProduceFn] = {"confluent-kafka": produce_confluent, "kafka-python": produce_kafka_python,
                                  "aiokafka": produce_aiokafka, "kcat": produce_kcat}
CONSUMERS: dict[str, ConsumeFn] = {"confluent-kafka": consume_confluent, "kafka-python": consume_kafka_python,
                                    "aiokafka": consume_aiokafka, "kcat": consume_kcat}


def records_for(client: str, seed: int) -> list[Record]:
    return kcat_records(RECORDS, seed) if client == "kcat" else binary_records(RECORDS, seed)


# ------------------------------------------------------------------------------------ checks


@dataclass
class Produced:
    topic: str
    records: list[Record]
    delivered: Delivered | None
    started_ms: int
    finished_ms: int


def produce(cluster: Cluster, client: str, codec: str, seed: int, timings: dict[str, float]) -> Produced:
    topic = unique_topic(f"{client}-{codec}-{cluster.name}")
    with cluster.wire() as wire:
        wire.create_topic(topic, PARTITIONS)
    records = records_for(client, seed)
    started = time.time()
    delivered = PRODUCERS[client](cluster.bootstrap, topic, records, codec)
    finished = time.time()
    timings[f"produce {client}"] = finished - started
    return Produced(topic, records, delivered, int(started * 1000) - 1, int(finished * 1000) + 1)


def consume_and_check(cluster: Cluster, client: str, produced: Produced, timings: dict[str, float]) -> None:
    started = time.time()
    consumed = CONSUMERS[client](cluster.bootstrap, produced.topic, len(produced.records))
    timings[f"consume {client}"] = time.time() - started
    check_round_trip(cluster, produced, consumed)


def check_round_trip(cluster: Cluster, produced: Produced, consumed: list[Consumed]) -> None:
    expected = produced.records
    by_key = {r.key: i for i, r in enumerate(expected)}
    assert len(consumed) == len(expected), f"consumed {len(consumed)} of {len(expected)} records"

    seen: set[int] = set()
    # (offset, index in `expected`) of each partition's records, in the order they were consumed
    per_partition: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
    for c in consumed:
        i = by_key.get(c.key) if c.key is not None else None
        assert i is not None, f"unexpected key {c.key!r} at {c.partition}/{c.offset}"
        assert i not in seen, f"record {i} consumed twice"
        seen.add(i)
        want = expected[i]
        got = (c.key, c.value, c.headers)
        assert got == (want.key, want.value, want.headers), f"record {i} differs at {c.partition}/{c.offset}"
        if want.timestamp is not None:
            assert c.timestamp == want.timestamp, f"record {i}: timestamp {c.timestamp} != {want.timestamp}"
        else:
            assert produced.started_ms <= c.timestamp <= produced.finished_ms, f"record {i}: timestamp {c.timestamp}"
        assert c.create_time in (True, None), f"record {i}: not a CreateTime timestamp"
        per_partition[c.partition].append((c.offset, i))

    for p, items in per_partition.items():
        assert items, f"partition {p} got no records: keys were not spread"
        assert [offset for offset, _ in items] == list(range(len(items))), f"partition {p}: offsets not 0..n-1"
        # Offsets follow arrival order even for requests that arrive while the owner is still opening.
        order = [i for _, i in items]
        assert order == sorted(order), f"partition {p}: records out of production order"
        if produced.delivered is not None:
            for offset, i in items:
                assert produced.delivered[i] == (p, offset), f"record {i} reported at {produced.delivered[i]}"

    with cluster.wire() as wire:
        assert wire.end_offsets(produced.topic, PARTITIONS) == [len(per_partition[p]) for p in range(PARTITIONS)]


def stored_batches(cluster: Cluster, topic: str) -> list[BatchHeader]:
    """The headers of every batch of the first partition, as a fetch returns them."""
    headers: list[BatchHeader] = []
    with cluster.wire() as wire:
        offset = 0
        while True:
            answer = wire.fetch(topic, 0, offset)
            assert answer.error_code == ErrorCode.none, answer.error_code
            if not answer.records:
                return headers
            batches = [h for _, h in split_batches(memoryview(answer.records), verify_crc=True)]
            headers += batches
            offset = batches[-1].last_offset + 1


SMALL_BATCH = 512


def check_codec(cluster: Cluster, topic: str, codec: str, *, idempotent: bool = False) -> None:
    batches = stored_batches(cluster, topic)
    assert batches
    # librdkafka sends a batch uncompressed when compressing would not shrink it (a linger flush of a
    # record or two): allowed for small batches, as long as nearly every record went compressed.
    plain = [h for h in batches if h.compression != CODEC_IDS[codec]]
    assert all(h.compression == 0 and h.size <= SMALL_BATCH for h in plain), "stored batches do not carry the codec"
    records = sum(h.record_count for h in batches)
    assert sum(h.record_count for h in plain) <= records // 50, "most records were stored uncompressed"
    if idempotent:
        assert all(h.producer_id >= 0 and h.base_sequence >= 0 for h in batches), "batches are not idempotent"


# ------------------------------------------------------------------------------------ throughput


@pytest.fixture
def timings(request: pytest.FixtureRequest) -> Iterator[dict[str, float]]:
    """Seconds each client took per run, reported in the session's summary (see conftest)."""
    mine: dict[str, float] = {}
    yield mine
    backend = request.getfixturevalue("broker").name
    for what, seconds in mine.items():
        record_throughput(request.config, f"{what} ({backend})", RECORDS, seconds)


# ------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", CLIENTS)
def test_client_round_trip(broker: Cluster, client: str, codec: str, timings: dict[str, float]) -> None:
    produced = produce(broker, client, codec, seed=zlib.crc32(f"{client}/{codec}".encode()), timings=timings)
    consume_and_check(broker, client, produced, timings)
    check_codec(broker, produced.topic, codec, idempotent=client == "kafka-python")


# Each producer gets another codec, so that every consumer decodes every codec from someone else.
CROSS_CODEC = {"confluent-kafka": "zstd", "kafka-python": "lz4", "aiokafka": "snappy", "kcat": "gzip"}


@pytest.mark.parametrize("producer", CLIENTS)
def test_cross_client(broker: Cluster, producer: str, timings: dict[str, float]) -> None:
    produced = produce(broker, producer, CROSS_CODEC[producer], seed=7, timings=timings)
    consumers = [c for c in CLIENTS if c != producer]
    for consumer in consumers:
        consume_and_check(broker, consumer, produced, timings)
