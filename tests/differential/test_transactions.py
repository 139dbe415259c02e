"""Transactions against Apache Kafka 4.4.0: the transactional APIs' answers (FindCoordinator for a transactional
id, InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn) and what they do to the read
side (markers, the last stable offset, aborted transactions, read_committed fetches and ListOffsets, OffsetFetch
with require_stable), in raw requests.

Each test runs twice: `[reference]` runs the case against Apache Kafka alone and holds its answers to the values
written down here (the case checked against the reference, with no Kafscale involved); `[kafscale]` runs it
against Kafka and then Kafscale and compares the two.

Normalised, because two brokers legitimately differ there: producer ids (each broker allocates its own: an id is
shown as "P" when it is the one InitProducerId gave the case, and every id must be >= 0), node ids, the
timestamps a broker stamps on a marker, and a marker's coordinator epoch (Kafka's is the leader epoch of a
__transaction_state partition). Error codes, offsets relative to the partition's start (both begin at 0), the
batches' attributes, producer epochs and sequences, and what a client sees of a control batch are compared as they
are. The versions spoken are those a client of today sends, at most what kio (and so Kafscale) knows:
`TXN_VERSIONS`; AddPartitionsToTxn at v3, the last client shape (v4+ is the broker-to-broker batch).
"""

from __future__ import annotations

import contextlib
import datetime
import struct
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from kafscale.protocol import make, request_class
from kafscale.protocol.errors import ErrorCode
from kafscale.testing.kafka_reference import ReferenceKafka
from tests.differential.wire import (
    DELETE_RECORDS,
    FETCH,
    FIND_COORDINATOR,
    OFFSET_FETCH,
    PRODUCE,
    T0,
    TIMEOUT,
    Peer,
    Row,
    code,
    req,
    sub,
    unique,
)

T = TypeVar("T")

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
TXN_VERSIONS = {INIT_PRODUCER_ID: 5, ADD_PARTITIONS_TO_TXN: 3, ADD_OFFSETS_TO_TXN: 4, END_TXN: 4,
                TXN_OFFSET_COMMIT: 4}  # fmt: skip
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
TXN_TIMEOUT_MS = 60_000
MAX_TXN_TIMEOUT_MS = 900_000  # transaction.max.timeout.ms, Kafka's default (Kafscale's too)
TRANSACTIONAL, CONTROL = 0x10, 0x20

# What a client retries (the Java producer's and librdkafka's TransactionManager): the coordinator is being
# created or loaded, or the previous transaction's markers are still being written.
RETRIABLE = {"COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS", "NOT_COORDINATOR",
             "CONCURRENT_TRANSACTIONS"}  # fmt: skip
DEADLINE_S = 30.0


# ------------------------------------------------------------------------------------------- the brokers


@pytest.fixture(params=["reference", "kafscale"])
def brokers(request: pytest.FixtureRequest, kafka_reference: ReferenceKafka) -> Iterator[list[Peer]]:
    """[reference]: Apache Kafka 4.4.0 alone. [kafscale]: Kafka, then Kafscale (the `kafscale` fixture)."""
    with contextlib.ExitStack() as stack:
        found = [stack.enter_context(Peer("kafka", kafka_reference.port))]
        if request.param == "kafscale":
            ours = request.getfixturevalue("kafscale")
            found.append(stack.enter_context(Peer("kafscale", ours.port)))
        yield found


def compare(brokers: list[Peer], case: Callable[[Peer], T], kafka: T) -> None:
    """Run `case` on each broker: Kafka must answer `kafka`, and Kafscale what Kafka answered."""
    got = {peer.name: case(peer) for peer in brokers}
    assert got["kafka"] == kafka
    if "kafscale" in got:
        assert got["kafscale"] == got["kafka"]


# ------------------------------------------------------------------------------------------ raw requests


def treq(api_key: int, /, version: int | None = None, **fields: Any) -> Any:
    """A request of a transactional API at TXN_VERSIONS[api_key] (or `version`)."""
    return make(request_class(api_key, TXN_VERSIONS[api_key] if version is None else version), **fields)


def tsub(api_key: int, entity: str, /, version: int | None = None, **fields: Any) -> Any:
    cls = request_class(api_key, TXN_VERSIONS[api_key] if version is None else version)
    return make(getattr(sys.modules[cls.__module__], entity), **fields)


def retrying(call: Callable[[], T], errors: Callable[[T], list[str]], what: str) -> T:
    """`call` again while any error it answers is one a client retries (bounded)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        answer = call()
        if not RETRIABLE.intersection(errors(answer)):
            return answer
        assert time.monotonic() < deadline, (what, answer)
        time.sleep(0.05)


def find_txn_coordinator(peer: Peer, *keys: str) -> Any:
    """FindCoordinator v4, key type TRANSACTION, until every key has one (Kafka creates __transaction_state on the
    first such request and answers COORDINATOR_NOT_AVAILABLE until it exists)."""
    return retrying(lambda: peer.call(req(FIND_COORDINATOR, key_type=1, coordinator_keys=keys)),
                    lambda a: [code(c.error_code) for c in a.coordinators], f"{peer.name} FindCoordinator")


def init_producer_id(peer: Peer, txn_id: str | None, *, timeout_ms: int = TXN_TIMEOUT_MS, producer_id: int = -1,
                     producer_epoch: int = -1, version: int | None = None) -> Any:
    """InitProducerId, retried while the coordinator loads or a previous transaction is being ended."""
    request = treq(INIT_PRODUCER_ID, version, transactional_id=txn_id,
                   transaction_timeout=datetime.timedelta(milliseconds=timeout_ms), producer_id=producer_id,
                   producer_epoch=producer_epoch)
    return retrying(lambda: peer.call(request), lambda a: [code(a.error_code)], f"{peer.name} InitProducerId")


class Txn:
    """One transactional producer spoken in raw requests: its id, and the producer id and epoch it was given."""

    def __init__(self, peer: Peer, txn_id: str | None = None, timeout_ms: int = TXN_TIMEOUT_MS) -> None:
        self.peer = peer
        self.id = txn_id or unique("txn")
        find_txn_coordinator(peer, self.id)
        answer = init_producer_id(peer, self.id, timeout_ms=timeout_ms)
        assert code(answer.error_code) == "NONE", (peer.name, answer)
        self.producer_id, self.epoch = int(answer.producer_id), int(answer.producer_epoch)
        self.sequences: dict[tuple[str, int], int] = {}

    def add_partitions(self, parts: dict[str, list[int]], *, version: int | None = None,
                       producer_id: int | None = None, epoch: int | None = None) -> dict[str, str]:
        """AddPartitionsToTxn (v3 shape): "topic:partition" -> error name."""
        v = TXN_VERSIONS[ADD_PARTITIONS_TO_TXN] if version is None else version
        topics = tuple(tsub(ADD_PARTITIONS_TO_TXN, "AddPartitionsToTxnTopic", v, name=t, partitions=tuple(ps))
                       for t, ps in parts.items())
        request = treq(ADD_PARTITIONS_TO_TXN, v, v3_and_below_transactional_id=self.id,
                       v3_and_below_producer_id=self.producer_id if producer_id is None else producer_id,
                       v3_and_below_producer_epoch=self.epoch if epoch is None else epoch,
                       v3_and_below_topics=topics)

        def errors(answer: Any) -> dict[str, str]:
            return {f"{t.name}:{p.partition_index}": code(p.partition_error_code)
                    for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition}

        answer = retrying(lambda: self.peer.call(request), lambda a: list(errors(a).values()),
                          f"{self.peer.name} AddPartitionsToTxn")
        return errors(answer)

    def add_offsets(self, group: str) -> str:
        request = treq(ADD_OFFSETS_TO_TXN, transactional_id=self.id, producer_id=self.producer_id,
                       producer_epoch=self.epoch, group_id=group)
        answer = retrying(lambda: self.peer.call(request), lambda a: [code(a.error_code)],
                          f"{self.peer.name} AddOffsetsToTxn")
        return code(answer.error_code)

    def txn_offset_commit(self, group: str, topic: str, offsets: dict[int, int]) -> dict[int, str]:
        parts = tuple(tsub(TXN_OFFSET_COMMIT, "TxnOffsetCommitRequestPartition", partition_index=p,
                           committed_offset=o, committed_leader_epoch=-1, committed_metadata="")
                      for p, o in offsets.items())
        request = treq(TXN_OFFSET_COMMIT, transactional_id=self.id, group_id=group, producer_id=self.producer_id,
                       producer_epoch=self.epoch, generation_id=-1, member_id="", group_instance_id=None,
                       topics=(tsub(TXN_OFFSET_COMMIT, "TxnOffsetCommitRequestTopic", name=topic, partitions=parts),))
        answer = retrying(lambda: self.peer.call(request),
                          lambda a: [code(p.error_code) for t in a.topics for p in t.partitions],
                          f"{self.peer.name} TxnOffsetCommit")
        return {int(p.partition_index): code(p.error_code) for t in answer.topics for p in t.partitions}

    def end(self, commit: bool, *, version: int | None = None, epoch: int | None = None) -> str:
        """EndTxn: its error name."""
        request = treq(END_TXN, version, transactional_id=self.id, producer_id=self.producer_id,
                       producer_epoch=self.epoch if epoch is None else epoch, committed=commit)
        answer = retrying(lambda: self.peer.call(request), lambda a: [code(a.error_code)],
                          f"{self.peer.name} EndTxn")
        return code(answer.error_code)

    def produce(self, topic: str, partition: int, rows: list[Row], *, epoch: int | None = None,
                version: int | None = None) -> tuple[str, int]:
        """One transactional batch (acks=all), its sequence following the last one sent to the partition:
        (error name, base offset). Produce v12 (transactions v2) adds the partition to the transaction itself."""
        seq = self.sequences.get((topic, partition), 0)
        records = txn_batch(self.producer_id, self.epoch if epoch is None else epoch, seq, rows)
        part = sub(PRODUCE, "PartitionProduceData", version, index=partition, records=records)
        request = req(PRODUCE, version, transactional_id=self.id, acks=-1, timeout=datetime.timedelta(seconds=30),
                      topic_data=(sub(PRODUCE, "TopicProduceData", version, name=topic, partition_data=(part,)),))
        answer = self.peer.call(request).responses[0].partition_responses[0]
        if answer.error_code == ErrorCode.none:
            self.sequences[(topic, partition)] = seq + len(rows)
        return code(answer.error_code), int(answer.base_offset)


def txn_batch(producer_id: int, epoch: int, base_sequence: int, rows: list[Row]) -> bytes:
    """One transactional v2 batch (attribute bit 0x10) of the rows, uncompressed, built by aiokafka."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=1, producer_id=producer_id,
                                        producer_epoch=epoch, base_sequence=base_sequence,
                                        batch_size=16 * 1024 * 1024)
    for delta, (key, value, timestamp) in enumerate(rows):
        assert builder.append(delta, timestamp=timestamp, key=key, value=value, headers=[]) is not None
    return bytes(builder.build())


def fetch(peer: Peer, topic: str, partition: int, offset: int, isolation_level: int) -> Any:
    """Fetch v12 of one partition, without waiting: its PartitionData."""
    part = sub(FETCH, "FetchPartition", partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20,
               current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
    request = req(FETCH, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0, max_bytes=1 << 20,
                  isolation_level=isolation_level, session_id=0, session_epoch=-1, rack_id="",
                  topics=(sub(FETCH, "FetchTopic", topic=topic, partitions=(part,)),), forgotten_topics_data=())
    return peer.call(request).responses[0].partitions[0]


def pid_name(producer_id: int, txn: Txn | None) -> str | int:
    if txn is not None and producer_id == txn.producer_id:
        return "P"
    assert producer_id == -1, f"a producer id the case does not know: {producer_id}"
    return producer_id


def batches(records: bytes | None, txn: Txn | None) -> list[tuple[Any, ...]]:
    """What a client reads of fetched records, batch by batch: (base offset, last offset, attributes, producer,
    epoch, base sequence, records); a control batch's records are ("COMMIT" | "ABORT", key version)."""
    found = []
    stream = MemoryRecords(bytes(records or b""))
    while (b := stream.next_batch()) is not None:
        if b.is_control_batch:
            content = []
            for r in b:
                version, kind = struct.unpack(">hh", r.key)
                content.append(({0: "ABORT", 1: "COMMIT"}.get(kind, kind), version))
        else:
            content = [(r.offset, r.key, r.value) for r in b]
        found.append((b.base_offset, b.next_offset - 1, b.attributes & ~0x08, pid_name(b.producer_id, txn),
                      b.producer_epoch, b.base_sequence, content))
    return found


def fetched(peer: Peer, topic: str, partition: int, offset: int, isolation_level: int, txn: Txn | None
            ) -> dict[str, Any]:
    """A fetch, as a client sees it: error, high watermark, last stable offset, aborted transactions, batches."""
    p = fetch(peer, topic, partition, offset, isolation_level)
    aborted = None if p.aborted_transactions is None else [
        (pid_name(int(a.producer_id), txn), int(a.first_offset)) for a in p.aborted_transactions]
    return {"error": code(p.error_code), "hw": int(p.high_watermark), "lso": int(p.last_stable_offset),
            "aborted": aborted, "batches": batches(p.records, txn)}


def latest(peer: Peer, topic: str, isolation_level: int) -> tuple[str, int]:
    p = peer.list_offsets(topic, [(0, -1)], isolation_level=isolation_level)[0]
    return code(p.error_code), int(p.offset)


def wait_for(what: str, probe: Callable[[], T], done: Callable[[T], bool]) -> T:
    """Poll `probe` until `done` holds (Kafka writes markers after EndTxn has answered), bounded."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = probe()
        if done(value):
            return value
        assert time.monotonic() < deadline, (what, value)
        time.sleep(0.05)


ROWS = [(b"k0", b"v0", T0), (b"k1", b"v1", T0 + 1), (b"k2", b"v2", T0 + 2)]
PLAIN = [(b"p0", b"plain0", T0), (b"p1", b"plain1", T0 + 1)]


def read_all(peer: Peer, topic: str, partition: int, isolation_level: int, txn: Txn | None, start: int = 0
             ) -> dict[str, Any]:
    """Fetch from `start` until the end a client may read (the high watermark, or the last stable offset for
    read_committed), as a consumer does: Kafka may answer one fetch with fewer batches than there are. The
    aborted transactions are those of all the fetches, in order, once each (None when every fetch said null)."""
    offset, found, aborted = start, [], None
    deadline = time.monotonic() + DEADLINE_S
    while True:
        got = fetched(peer, topic, partition, offset, isolation_level, txn)
        assert got["error"] == "NONE", (peer.name, got)
        if got["aborted"] is not None:
            aborted = [*(aborted or []), *(a for a in got["aborted"] if a not in (aborted or []))]
        found += got["batches"]
        if found:
            offset = found[-1][1] + 1
        end = got["lso"] if isolation_level == READ_COMMITTED else got["hw"]
        if offset >= end:
            return {"hw": got["hw"], "lso": got["lso"], "aborted": aborted, "batches": found}
        assert time.monotonic() < deadline, (peer.name, topic, partition, offset, got)
        time.sleep(0.02)


def named(answer: dict[str, str], topic: str) -> dict[str, str]:
    """AddPartitionsToTxn's errors with the case's topic shown as T (the same name on both brokers anyway)."""
    return {k.replace(topic, "T"): v for k, v in answer.items()}


# ------------------------------------------------------------------------------------ FindCoordinator


def test_find_coordinator_for_transactional_ids(brokers: list[Peer]) -> None:
    """Key type 1 (TRANSACTION): every transactional id has a coordinator, this broker (each is a single node);
    also in the v3 shape (one key). Node ids are each broker's own: only their being set is compared."""

    def case(peer: Peer) -> Any:
        a, b = unique("txn"), unique("txn")
        v4 = find_txn_coordinator(peer, a, b)
        v3 = peer.call(req(FIND_COORDINATOR, version=3, key_type=1, key=a))
        return ([(c.key == k, code(c.error_code), c.node_id >= 0, c.host, c.port == peer.port)
                 for c, k in zip(v4.coordinators, (a, b), strict=True)],
                (code(v3.error_code), v3.node_id >= 0, v3.host, v3.port == peer.port))

    compare(brokers, case, ([(True, "NONE", True, "127.0.0.1", True)] * 2, ("NONE", True, "127.0.0.1", True)))


# -------------------------------------------------------------------------------------- InitProducerId


def test_init_producer_id_bumps_the_epoch_and_keeps_the_producer_id(brokers: list[Peer]) -> None:
    """The first InitProducerId of a transactional id gives epoch 0, each later one the next epoch of the same
    producer id. With the producer's own id and epoch (KIP-360, v3+), the epoch is bumped too; a retry of that
    (the epoch before the current one) gets the current epoch again; an older epoch, or another producer id, is
    fenced: PRODUCER_FENCED from v4 on, INVALID_PRODUCER_EPOCH before. Without a transactional id (an
    idempotent producer) a new producer id, epoch 0."""

    def case(peer: Peer) -> Any:
        txn_id = unique("txn")
        find_txn_coordinator(peer, txn_id)
        first = init_producer_id(peer, txn_id)
        pid = int(first.producer_id)
        assert pid >= 0, (peer.name, first)

        def seen(a: Any) -> tuple[str, str | int, int]:
            other = a.producer_id if a.producer_id < 0 else ("P" if a.producer_id == pid else "another")
            return code(a.error_code), other, int(a.producer_epoch)

        steps = {"first": seen(first), "second": seen(init_producer_id(peer, txn_id))}
        steps["own-id-and-epoch"] = seen(init_producer_id(peer, txn_id, producer_id=pid, producer_epoch=1))
        steps["retried"] = seen(init_producer_id(peer, txn_id, producer_id=pid, producer_epoch=1))
        steps["older-epoch-v4"] = seen(init_producer_id(peer, txn_id, producer_id=pid, producer_epoch=0, version=4))
        steps["older-epoch-v3"] = seen(init_producer_id(peer, txn_id, producer_id=pid, producer_epoch=0, version=3))
        steps["other-producer-id"] = seen(init_producer_id(peer, txn_id, producer_id=pid + 1000, producer_epoch=2))
        steps["after"] = seen(init_producer_id(peer, txn_id))
        steps["idempotent"] = seen(init_producer_id(peer, None))
        return steps

    compare(brokers, case, {
        "first": ("NONE", "P", 0), "second": ("NONE", "P", 1), "own-id-and-epoch": ("NONE", "P", 2),
        "retried": ("NONE", "P", 2), "older-epoch-v4": ("PRODUCER_FENCED", -1, -1),
        "older-epoch-v3": ("INVALID_PRODUCER_EPOCH", -1, -1), "other-producer-id": ("PRODUCER_FENCED", -1, -1),
        "after": ("NONE", "P", 3), "idempotent": ("NONE", "another", 0),
    })  # fmt: skip


def test_a_transaction_timeout_above_the_maximum_is_refused(brokers: list[Peer]) -> None:
    """transaction.max.timeout.ms (900000, Kafka's default) is allowed, one more is INVALID_TRANSACTION_TIMEOUT,
    and so are 0 and a negative timeout; a refused InitProducerId of a known id bumps nothing."""

    def case(peer: Peer) -> Any:
        txn_id = unique("txn")
        find_txn_coordinator(peer, txn_id)
        steps = {}
        for label, ms in (("max", MAX_TXN_TIMEOUT_MS), ("max+1", MAX_TXN_TIMEOUT_MS + 1), ("zero", 0),
                          ("negative", -1)):
            a = init_producer_id(peer, unique("txn"), timeout_ms=ms)
            steps[label] = (code(a.error_code), a.producer_id >= 0, int(a.producer_epoch))
        first = init_producer_id(peer, txn_id)
        refused = init_producer_id(peer, txn_id, timeout_ms=MAX_TXN_TIMEOUT_MS + 1)
        again = init_producer_id(peer, txn_id)
        steps["known-id"] = (code(first.error_code), code(refused.error_code), int(refused.producer_id),
                             again.producer_id == first.producer_id, int(again.producer_epoch))
        return steps

    refused = ("INVALID_TRANSACTION_TIMEOUT", False, -1)
    compare(brokers, case, {"max": ("NONE", True, 0), "max+1": refused, "zero": refused, "negative": refused,
                            "known-id": ("NONE", "INVALID_TRANSACTION_TIMEOUT", -1, True, 1)})


# ---------------------------------------------------------------------------------- AddPartitionsToTxn


def test_add_partitions_with_an_unknown_topic_or_partition(brokers: list[Peer], topic: str) -> None:
    """One unknown partition fails the whole request: it gets UNKNOWN_TOPIC_OR_PARTITION, every other partition
    OPERATION_NOT_ATTEMPTED, and nothing is added (EndTxn then finds no transaction: INVALID_TXN_STATE)."""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 2)
        txn = Txn(peer)
        return (named(txn.add_partitions({topic: [0, 1], f"{topic}-none": [0]}), topic),
                named(txn.add_partitions({topic: [0, 7]}), topic), txn.end(True), txn.end(False))

    compare(brokers, case, (
        {"T:0": "OPERATION_NOT_ATTEMPTED", "T:1": "OPERATION_NOT_ATTEMPTED", "T-none:0": "UNKNOWN_TOPIC_OR_PARTITION"},
        {"T:0": "OPERATION_NOT_ATTEMPTED", "T:7": "UNKNOWN_TOPIC_OR_PARTITION"},
        "INVALID_TXN_STATE", "INVALID_TXN_STATE",
    ))  # fmt: skip


def test_a_fenced_producer_is_refused_by_every_transactional_api(brokers: list[Peer], topic: str) -> None:
    """A second InitProducerId of the same transactional id fences the first producer: its stale epoch gets
    INVALID_PRODUCER_EPOCH from AddPartitionsToTxn v0-1, AddOffsetsToTxn v0-1 and EndTxn v0-1, PRODUCER_FENCED
    from their later versions (KIP-588); TxnOffsetCommit and Produce answer INVALID_PRODUCER_EPOCH at every
    version. An epoch newer than the coordinator's is fenced too."""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 1)
        group = unique("g")
        peer.coordinator(group)
        old = Txn(peer)
        new = Txn(peer, old.id)
        assert (new.producer_id, new.epoch) == (old.producer_id, old.epoch + 1), (peer.name, vars(new))
        assert named(new.add_partitions({topic: [0]}), topic) == {"T:0": "NONE"}, peer.name
        assert new.add_offsets(group) == "NONE", peer.name
        steps: dict[str, Any] = {
            "add-partitions": {v: named(old.add_partitions({topic: [0]}, version=v), topic)["T:0"]
                               for v in range(4)},
            "add-offsets": {}, "txn-offset-commit": {}, "end-txn": {},
        }
        for v in range(5):
            request = treq(ADD_OFFSETS_TO_TXN, v, transactional_id=old.id, producer_id=old.producer_id,
                           producer_epoch=old.epoch, group_id=group)
            steps["add-offsets"][v] = code(peer.call(request).error_code)
            request = treq(TXN_OFFSET_COMMIT, v, transactional_id=old.id, group_id=group,
                           producer_id=old.producer_id, producer_epoch=old.epoch, generation_id=-1, member_id="",
                           group_instance_id=None, topics=(tsub(
                               TXN_OFFSET_COMMIT, "TxnOffsetCommitRequestTopic", v, name=topic, partitions=(tsub(
                                   TXN_OFFSET_COMMIT, "TxnOffsetCommitRequestPartition", v, partition_index=0,
                                   committed_offset=1, committed_leader_epoch=-1, committed_metadata=""),)),))
            steps["txn-offset-commit"][v] = code(peer.call(request).topics[0].partitions[0].error_code)
            steps["end-txn"][v] = old.end(True, version=v)
        steps["produce"] = old.produce(topic, 0, ROWS)
        steps["newer-epoch"] = named(new.add_partitions({topic: [0]}, epoch=new.epoch + 1), topic)
        steps["new-producer-commits"] = new.end(True)
        return steps

    old_style, fenced = "INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED"
    compare(brokers, case, {
        "add-partitions": {0: old_style, 1: old_style, 2: fenced, 3: fenced},
        "add-offsets": {0: old_style, 1: old_style, 2: fenced, 3: fenced, 4: fenced},
        "txn-offset-commit": dict.fromkeys(range(5), old_style),
        "end-txn": {0: old_style, 1: old_style, 2: fenced, 3: fenced, 4: fenced},
        "produce": (old_style, -1),
        "newer-epoch": {"T:0": fenced},
        "new-producer-commits": "NONE",
    })  # fmt: skip


def test_a_wrong_producer_id_or_an_unknown_transactional_id(brokers: list[Peer], topic: str) -> None:
    """A producer id the transactional id does not have, or a transactional id the coordinator never saw:
    INVALID_PRODUCER_ID_MAPPING, from AddPartitionsToTxn and from EndTxn."""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 1)
        txn = Txn(peer)
        wrong = named(txn.add_partitions({topic: [0]}, producer_id=txn.producer_id + 1000), topic)
        stranger = Txn.__new__(Txn)  # never initialised: a transactional id the coordinator does not know
        stranger.peer, stranger.id, stranger.producer_id, stranger.epoch = peer, unique("txn"), txn.producer_id, 0
        real, txn.producer_id = txn.producer_id, txn.producer_id + 1000
        end_wrong = txn.end(True)
        txn.producer_id = real
        return {"add-wrong-producer-id": wrong, "end-wrong-producer-id": end_wrong,
                "add-unknown-id": named(stranger.add_partitions({topic: [0]}), topic),
                "end-unknown-id": stranger.end(False)}

    mapping = "INVALID_PRODUCER_ID_MAPPING"
    compare(brokers, case, {"add-wrong-producer-id": {"T:0": mapping}, "end-wrong-producer-id": mapping,
                            "add-unknown-id": {"T:0": mapping}, "end-unknown-id": mapping})


# ----------------------------------------------------------------------------------- EndTxn and markers


def test_end_txn_without_a_transaction(brokers: list[Peer], topic: str) -> None:
    """Commit or abort with no ongoing transaction is INVALID_TXN_STATE. After a commit, the same commit again is
    a retry (NONE), an abort is INVALID_TXN_STATE; after an abort, a commit is INVALID_TXN_STATE."""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 1)
        txn = Txn(peer)
        steps = {"commit-none": txn.end(True), "abort-none": txn.end(False)}
        txn.add_partitions({topic: [0]})
        steps["commit"] = txn.end(True)
        steps["commit-again"], steps["abort-after-commit"] = txn.end(True), txn.end(False)
        txn.add_partitions({topic: [0]})
        steps["abort"] = txn.end(False)
        steps["abort-again"], steps["commit-after-abort"] = txn.end(False), txn.end(True)
        return steps

    compare(brokers, case, {"commit-none": "INVALID_TXN_STATE", "abort-none": "INVALID_TXN_STATE",
                            "commit": "NONE", "commit-again": "NONE", "abort-after-commit": "INVALID_TXN_STATE",
                            "abort": "NONE", "abort-again": "NONE", "commit-after-abort": "INVALID_TXN_STATE"})


def marker(offset: int, kind: str, epoch: int = 0) -> tuple[Any, ...]:
    """A control batch as `batches` shows it: one record, transactional and control, no sequence."""
    return (offset, offset, TRANSACTIONAL | CONTROL, "P", epoch, -1, [(kind, 0)])


def test_end_txn_writes_a_marker_into_every_partition_of_the_transaction(brokers: list[Peer], topic: str) -> None:
    """A transaction of two partitions and no records commits: each partition gets one COMMIT control batch
    (attributes 0x30, the producer's id and epoch, no sequence, key version 0) at offset 0, and the high
    watermark and last stable offset move past it, for read_uncommitted and read_committed alike (the client
    drops control batches). Then an aborted transaction of partition 0 only: an ABORT marker there at offset 1,
    nothing in partition 1."""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 2)
        txn = Txn(peer)
        steps: dict[str, Any] = {"add": named(txn.add_partitions({topic: [0, 1]}), topic), "commit": txn.end(True)}
        for p in (0, 1):
            wait_for("the commit markers", lambda p=p: latest_of(peer, topic, p), lambda hw: hw == 1)
            steps[f"p{p}-uncommitted"] = read_all(peer, topic, p, READ_UNCOMMITTED, txn)
            steps[f"p{p}-committed"] = read_all(peer, topic, p, READ_COMMITTED, txn)
        steps["add-again"] = named(txn.add_partitions({topic: [0]}), topic)
        steps["abort"] = txn.end(False)
        wait_for("the abort marker", lambda: latest_of(peer, topic, 0), lambda hw: hw == 2)
        steps["p0-after-abort"] = read_all(peer, topic, 0, READ_COMMITTED, txn)
        steps["p1-after-abort"] = read_all(peer, topic, 1, READ_UNCOMMITTED, txn)
        return steps

    def view(aborted: list[Any] | None, *batch: Any) -> dict[str, Any]:
        return {"hw": len(batch), "lso": len(batch), "aborted": aborted, "batches": list(batch)}

    committed = marker(0, "COMMIT")
    compare(brokers, case, {
        "add": {"T:0": "NONE", "T:1": "NONE"}, "commit": "NONE",
        "p0-uncommitted": view(None, committed), "p0-committed": view([], committed),
        "p1-uncommitted": view(None, committed), "p1-committed": view([], committed),
        "add-again": {"T:0": "NONE"}, "abort": "NONE",
        # an abort with no records aborts nothing a reader must skip: no aborted transaction is listed
        "p0-after-abort": view([], committed, marker(1, "ABORT")),
        "p1-after-abort": view(None, committed),
    })  # fmt: skip


def latest_of(peer: Peer, topic: str, partition: int) -> int:
    p = peer.list_offsets(topic, [(partition, -1)])[partition]
    assert p.error_code == ErrorCode.none, (peer.name, p)
    return int(p.offset)


# ------------------------------------------------------------------------------------ the read side


def plain(offset: int) -> tuple[Any, ...]:
    """The PLAIN batch (no producer id) at `offset`, as `batches` shows it."""
    return (offset, offset + 1, 0, -1, -1, -1, [(offset + i, k, v) for i, (k, v, _) in enumerate(PLAIN)])


def transactional(offset: int, epoch: int = 0, sequence: int = 0) -> tuple[Any, ...]:
    """The ROWS batch of the case's producer at `offset`."""
    return (offset, offset + 2, TRANSACTIONAL, "P", epoch, sequence,
            [(offset + i, k, v) for i, (k, v, _) in enumerate(ROWS)])


def test_read_committed_stops_at_the_last_stable_offset_until_the_commit(brokers: list[Peer], topic: str) -> None:
    """Records 0-1 plain, 2-4 in an open transaction, 5-6 plain. read_committed reads up to the last stable offset,
    2 (the transaction's first offset), and ListOffsets latest with isolation_level 1 answers it; read_uncommitted
    reads everything up to the high watermark, 7. Fetch shows the LSO to both. A transactional batch sent to a
    partition the transaction does not have is refused (KIP-890's verification: INVALID_TXN_STATE at Produce v9).
    After the commit the COMMIT marker is at 7 and the LSO is the high watermark, 8."""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 1)
        txn = Txn(peer)
        steps: dict[str, Any] = {"not-added": txn.produce(topic, 0, ROWS)}
        assert peer.append(topic, 0, PLAIN) == 0, peer.name
        steps["add"] = named(txn.add_partitions({topic: [0]}), topic)
        steps["produce"] = txn.produce(topic, 0, ROWS)
        assert peer.append(topic, 0, PLAIN) == 5, peer.name
        steps["open"] = {"uncommitted": read_all(peer, topic, 0, READ_UNCOMMITTED, txn),
                         "committed": read_all(peer, topic, 0, READ_COMMITTED, txn),
                         "latest": latest(peer, topic, READ_UNCOMMITTED),
                         "latest-committed": latest(peer, topic, READ_COMMITTED)}
        steps["commit"] = txn.end(True)
        wait_for("the last stable offset past the marker", lambda: fetch(peer, topic, 0, 0, READ_COMMITTED),
                 lambda p: p.last_stable_offset == 8)
        steps["committed"] = {"uncommitted": read_all(peer, topic, 0, READ_UNCOMMITTED, txn),
                              "committed": read_all(peer, topic, 0, READ_COMMITTED, txn),
                              "latest": latest(peer, topic, READ_UNCOMMITTED),
                              "latest-committed": latest(peer, topic, READ_COMMITTED)}
        return steps

    everything, commit = [plain(0), transactional(2), plain(5)], marker(7, "COMMIT")
    compare(brokers, case, {
        "not-added": ("INVALID_TXN_STATE", -1),
        "add": {"T:0": "NONE"}, "produce": ("NONE", 2),
        "open": {"uncommitted": {"hw": 7, "lso": 2, "aborted": None, "batches": everything},
                 "committed": {"hw": 7, "lso": 2, "aborted": [], "batches": [plain(0)]},
                 "latest": ("NONE", 7), "latest-committed": ("NONE", 2)},
        "commit": "NONE",
        "committed": {"uncommitted": {"hw": 8, "lso": 8, "aborted": None, "batches": [*everything, commit]},
                      "committed": {"hw": 8, "lso": 8, "aborted": [], "batches": [*everything, commit]},
                      "latest": ("NONE", 8), "latest-committed": ("NONE", 8)},
    })  # fmt: skip


def test_an_aborted_transaction_is_listed_in_fetch(brokers: list[Peer], topic: str) -> None:
    """Records 0-1 plain, 2-4 in a transaction that aborts (its ABORT marker at 5), 6-7 plain. read_committed
    fetches list the aborted transaction as (producer id, first offset 2) whenever the fetched range reaches into
    it (from 0, from 3, from the marker at 5), and not from 6 on; the aborted records themselves are still
    returned (the client drops them). read_uncommitted lists nothing (null). The LSO is the high watermark."""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 1)
        txn = Txn(peer)
        assert peer.append(topic, 0, PLAIN) == 0, peer.name
        steps: dict[str, Any] = {"add": named(txn.add_partitions({topic: [0]}), topic),
                                 "produce": txn.produce(topic, 0, ROWS), "abort": txn.end(False)}
        wait_for("the abort marker", lambda: latest_of(peer, topic, 0), lambda hw: hw == 6)
        assert peer.append(topic, 0, PLAIN) == 6, peer.name
        steps["uncommitted"] = read_all(peer, topic, 0, READ_UNCOMMITTED, txn)
        steps["committed"] = read_all(peer, topic, 0, READ_COMMITTED, txn)
        steps["aborted-from"] = {offset: fetched(peer, topic, 0, offset, READ_COMMITTED, txn)["aborted"]
                                 for offset in (3, 5, 6, 7)}
        steps["latest-committed"] = latest(peer, topic, READ_COMMITTED)
        return steps

    everything = [plain(0), transactional(2), marker(5, "ABORT"), plain(6)]
    compare(brokers, case, {
        "add": {"T:0": "NONE"}, "produce": ("NONE", 2), "abort": "NONE",
        "uncommitted": {"hw": 8, "lso": 8, "aborted": None, "batches": everything},
        "committed": {"hw": 8, "lso": 8, "aborted": [("P", 2)], "batches": everything},
        "aborted-from": {3: [("P", 2)], 5: [("P", 2)], 6: [], 7: []},
        "latest-committed": ("NONE", 8),
    })  # fmt: skip


def delete_records(peer: Peer, topic: str, partition: int, offset: int) -> tuple[str, int]:
    answer = peer.call(req(DELETE_RECORDS, timeout=TIMEOUT, topics=(sub(
        DELETE_RECORDS, "DeleteRecordsTopic", name=topic,
        partitions=(sub(DELETE_RECORDS, "DeleteRecordsPartition", partition_index=partition, offset=offset),)),)))
    [p] = answer.topics[0].partitions
    return code(p.error_code), int(p.low_watermark)


def test_the_last_stable_offset_never_falls_below_the_log_start(brokers: list[Peer], topic: str) -> None:
    """Records 0-2 in an open transaction, 3-4 plain; then DeleteRecords (or time retention) moves the log start
    to 3, past the transaction's first offset. The last stable offset is then the log start, 3, not 0: a
    read_committed consumer reset to the end must land inside the log, not below it (where every fetch is
    OFFSET_OUT_OF_RANGE and every reset lands there again). The commit's marker at 5 then frees the log.
    (A log start inside a batch, say 4, is where Kafka answers the batch's base, 3, below its own log start;
    Kafscale answers the log start. Retention only ever moves it to a segment's base.)"""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 1)
        txn = Txn(peer)
        steps: dict[str, Any] = {"add": named(txn.add_partitions({topic: [0]}), topic),
                                 "produce": txn.produce(topic, 0, ROWS)}
        assert peer.append(topic, 0, PLAIN) == 3, peer.name
        steps["delete"] = delete_records(peer, topic, 0, 3)
        steps["latest-committed"] = latest(peer, topic, READ_COMMITTED)
        steps["open"] = fetched(peer, topic, 0, 3, READ_COMMITTED, txn)
        steps["commit"] = txn.end(True)
        wait_for("the commit marker", lambda: latest(peer, topic, READ_COMMITTED), lambda answer: answer[1] == 6)
        steps["committed"] = read_all(peer, topic, 0, READ_COMMITTED, txn, start=3)
        return steps

    compare(brokers, case, {
        "add": {"T:0": "NONE"}, "produce": ("NONE", 0), "delete": ("NONE", 3),
        "latest-committed": ("NONE", 3),
        "open": {"error": "NONE", "hw": 5, "lso": 3, "aborted": [], "batches": []},
        "commit": "NONE",
        "committed": {"hw": 6, "lso": 6, "aborted": [], "batches": [plain(3), marker(5, "COMMIT")]},
    })  # fmt: skip


# ------------------------------------------------------------------------------- offsets in a transaction


def stable_offsets(peer: Peer, group: str, topic: str, require_stable: bool) -> tuple[str, dict[int, Any]]:
    """OffsetFetch v8 of partitions 0 and 1: the group's error, and (offset, error) per partition."""
    answer = peer.call(req(OFFSET_FETCH, require_stable=require_stable, groups=(sub(
        OFFSET_FETCH, "OffsetFetchRequestGroup", group_id=group, topics=(
            sub(OFFSET_FETCH, "OffsetFetchRequestTopics", name=topic, partition_indexes=(0, 1)),)),)))
    [g] = answer.groups
    return code(g.error_code), {int(p.partition_index): (int(p.committed_offset), code(p.error_code))
                                for t in g.topics for p in t.partitions}


def test_txn_offset_commit_is_unstable_until_the_transaction_ends(brokers: list[Peer], topic: str) -> None:
    """TxnOffsetCommit before AddOffsetsToTxn is refused (KIP-890 verification: INVALID_TXN_STATE before v4,
    TRANSACTION_ABORTABLE at v4). After AddOffsetsToTxn, an offset committed in the transaction is pending:
    OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT (offset -1) for that partition, NONE for the
    others; without require_stable the last committed offset (none: -1). After the commit the offset is fetched;
    offsets of an aborted transaction are dropped (the committed one stays)."""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 2)
        group = unique("g")
        peer.coordinator(group)
        txn = Txn(peer)
        steps: dict[str, Any] = {
            "not-added-v3": commit_offsets(peer, txn, group, topic, {0: 5}, version=3),
            "not-added-v4": commit_offsets(peer, txn, group, topic, {0: 5}, version=4),
            "add-offsets": txn.add_offsets(group), "txn-offset-commit": txn.txn_offset_commit(group, topic, {0: 5}),
        }
        steps["pending"] = stable_offsets(peer, group, topic, True), stable_offsets(peer, group, topic, False)
        steps["commit"] = txn.end(True)
        steps["committed"] = wait_for("the committed offset", lambda: stable_offsets(peer, group, topic, True),
                                      lambda a: a[1][0][1] != "UNSTABLE_OFFSET_COMMIT")
        steps["add-offsets-2"] = txn.add_offsets(group)
        steps["txn-offset-commit-2"] = txn.txn_offset_commit(group, topic, {0: 9, 1: 3})
        steps["pending-2"] = stable_offsets(peer, group, topic, True)
        steps["abort"] = txn.end(False)
        steps["aborted"] = wait_for("the aborted offsets dropped", lambda: stable_offsets(peer, group, topic, True),
                                    lambda a: "UNSTABLE_OFFSET_COMMIT" not in {e for _, e in a[1].values()})
        return steps

    unstable = (-1, "UNSTABLE_OFFSET_COMMIT")
    compare(brokers, case, {
        "not-added-v3": {0: "INVALID_TXN_STATE"}, "not-added-v4": {0: "TRANSACTION_ABORTABLE"},
        "add-offsets": "NONE", "txn-offset-commit": {0: "NONE"},
        "pending": (("NONE", {0: unstable, 1: (-1, "NONE")}), ("NONE", {0: (-1, "NONE"), 1: (-1, "NONE")})),
        "commit": "NONE",
        "committed": ("NONE", {0: (5, "NONE"), 1: (-1, "NONE")}),
        "add-offsets-2": "NONE", "txn-offset-commit-2": {0: "NONE", 1: "NONE"},
        "pending-2": ("NONE", {0: unstable, 1: unstable}),
        "abort": "NONE",
        "aborted": ("NONE", {0: (5, "NONE"), 1: (-1, "NONE")}),
    })  # fmt: skip


def commit_offsets(peer: Peer, txn: Txn, group: str, topic: str, offsets: dict[int, int], version: int
                   ) -> dict[int, str]:
    """One TxnOffsetCommit at `version`, not retried: partition -> error name."""
    parts = tuple(tsub(TXN_OFFSET_COMMIT, "TxnOffsetCommitRequestPartition", version, partition_index=p,
                       committed_offset=o, committed_leader_epoch=-1, committed_metadata="")
                  for p, o in offsets.items())
    request = treq(TXN_OFFSET_COMMIT, version, transactional_id=txn.id, group_id=group,
                   producer_id=txn.producer_id, producer_epoch=txn.epoch, generation_id=-1, member_id="",
                   group_instance_id=None,
                   topics=(tsub(TXN_OFFSET_COMMIT, "TxnOffsetCommitRequestTopic", version, name=topic,
                                partitions=parts),))
    answer = peer.call(request)
    return {int(p.partition_index): code(p.error_code) for t in answer.topics for p in t.partitions}


def test_init_producer_id_aborts_the_transaction_the_previous_epoch_left_open(brokers: list[Peer],
                                                                              topic: str) -> None:
    """A producer's transaction is open (records 0-2); a new producer of the same transactional id calls
    InitProducerId: the coordinator aborts the open transaction with a bumped epoch (its ABORT marker carries
    epoch 1) and gives the new producer the epoch after that (2). read_committed readers get past the aborted
    records; the new producer's own transaction then commits."""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 1)
        old = Txn(peer)
        steps: dict[str, Any] = {"add": named(old.add_partitions({topic: [0]}), topic),
                                 "produce": old.produce(topic, 0, ROWS)}
        new = Txn(peer, old.id)
        steps["new-epoch"] = (new.producer_id == old.producer_id, new.epoch)
        wait_for("the abort marker", lambda: latest_of(peer, topic, 0), lambda hw: hw == 4)
        steps["new-add"] = named(new.add_partitions({topic: [0]}), topic)
        steps["new-produce"] = new.produce(topic, 0, ROWS)
        steps["new-commit"] = new.end(True)
        wait_for("the commit marker", lambda: fetch(peer, topic, 0, 0, READ_COMMITTED),
                 lambda p: p.last_stable_offset == 8)
        steps["committed"] = read_all(peer, topic, 0, READ_COMMITTED, new)
        return steps

    compare(brokers, case, {
        "add": {"T:0": "NONE"}, "produce": ("NONE", 0), "new-epoch": (True, 2),
        "new-add": {"T:0": "NONE"}, "new-produce": ("NONE", 4), "new-commit": "NONE",
        "committed": {"hw": 8, "lso": 8, "aborted": [("P", 0)], "batches": [
            transactional(0), marker(3, "ABORT", epoch=1), transactional(4, epoch=2), marker(7, "COMMIT", epoch=2)]},
    })  # fmt: skip


# ------------------------------------------------------------------------- transactions v2 (KIP-890 part 2)


def end_v2(txn: Txn, commit: bool) -> tuple[str, str | int, int]:
    """EndTxn v5 at the producer's epoch as the case holds it: (error, the producer id to go on with, its epoch)."""
    request = treq(END_TXN, 5, transactional_id=txn.id, producer_id=txn.producer_id, producer_epoch=txn.epoch,
                   committed=commit)
    answer = retrying(lambda: txn.peer.call(request), lambda a: [code(a.error_code)], f"{txn.peer.name} EndTxn")
    return code(answer.error_code), pid_name(int(answer.producer_id), txn), int(answer.producer_epoch)


def test_transactions_v2_bump_the_epoch_with_every_ending(brokers: list[Peer], topic: str) -> None:
    """Transactions v2, in the requests a Kafka 4 client sends once `transaction.version` is 2: Produce v12 adds
    its partition and TxnOffsetCommit v5 its group (no AddPartitionsToTxn or AddOffsetsToTxn); EndTxn v5 ends the
    transaction at the next epoch, which its marker carries and its answer gives. A retry at the old epoch (the
    answer lost) gets the same answer, the other outcome INVALID_TXN_STATE; the old epoch is fenced from then on.
    An abort with nothing open is an empty abort that bumps the epoch again."""

    def case(peer: Peer) -> Any:
        peer.create_ready(topic, 2)
        group = unique("g")
        peer.coordinator(group)
        txn = Txn(peer)
        steps: dict[str, Any] = {"produce": txn.produce(topic, 0, ROWS, version=12),
                                 "offsets": commit_offsets(peer, txn, group, topic, {0: 3}, version=5)}
        steps["commit"] = end_v2(txn, True)
        steps["commit-retry"], steps["abort-retry"] = end_v2(txn, True), end_v2(txn, False)
        steps["committed"] = wait_for("the committed offset", lambda: stable_offsets(peer, group, topic, True),
                                      lambda a: a[1][0][1] != "UNSTABLE_OFFSET_COMMIT")
        steps["zombie"] = txn.produce(topic, 0, ROWS, version=12)  # still at epoch 0
        txn.epoch, txn.sequences = steps["commit"][2], {}  # a new epoch starts its sequences at 0
        steps["empty-abort"] = end_v2(txn, False)
        txn.epoch = steps["empty-abort"][2]
        steps["produce-2"] = txn.produce(topic, 0, ROWS, version=12)
        steps["abort"] = end_v2(txn, False)
        wait_for("the abort marker", lambda: latest_of(peer, topic, 0), lambda hw: hw == 8)
        steps["log"] = read_all(peer, topic, 0, READ_UNCOMMITTED, txn)
        steps["read-committed"] = read_all(peer, topic, 0, READ_COMMITTED, txn)
        return steps

    log = [transactional(0), marker(3, "COMMIT", 1), transactional(4, epoch=2), marker(7, "ABORT", 3)]
    compare(brokers, case, {
        "produce": ("NONE", 0), "offsets": {0: "NONE"},
        "commit": ("NONE", "P", 1), "commit-retry": ("NONE", "P", 1), "abort-retry": ("INVALID_TXN_STATE", -1, -1),
        "committed": ("NONE", {0: (3, "NONE"), 1: (-1, "NONE")}),
        "zombie": ("INVALID_PRODUCER_EPOCH", -1),
        "empty-abort": ("NONE", "P", 2), "produce-2": ("NONE", 4), "abort": ("NONE", "P", 3),
        "log": {"hw": 8, "lso": 8, "aborted": None, "batches": log},
        "read-committed": {"hw": 8, "lso": 8, "aborted": [("P", 4)], "batches": log},
    })  # fmt: skip
