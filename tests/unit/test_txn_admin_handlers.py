"""The transactions' admin APIs against the fake broker (a real transaction registry, markers into the fake logs):
ListTransactions' filters, DescribeTransactions' states and errors, DescribeProducers' per-partition answers and
WriteTxnMarkers, as Kafka answers them (the differential suite compares the same with Apache Kafka)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from kafscale.acceptor.handlers import (
    add_partitions_to_txn,
    describe_producers,
    describe_transactions,
    end_txn,
    list_transactions,
    write_txn_markers,
)
from kafscale.acceptor.handlers.common import from_datetime, ms
from kafscale.broker.producer_state import ProducerStates
from kafscale.broker.txn_admin import ActiveProducer, active_producers
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.batch import read_header, split_batches
from kafscale.storage.control import marker_of
from tests.unit.fake_broker import FakeBroker, context, fake_broker
from tests.unit.test_handlers import group_not_coordinated_here, part, request
from tests.unit.test_txn_handlers import add_v3, init


async def listed(broker: FakeBroker, version: int = 1, **filters: Any) -> tuple[ErrorCode, tuple[str, ...],
                                                                                 dict[str, tuple[int, str]]]:
    answer = await list_transactions.handle(broker, context(66, version), request(66, version, **filters))
    return (answer.error_code, tuple(answer.unknown_state_filters),
            {s.transactional_id: (s.producer_id, s.transaction_state) for s in answer.transaction_states})


async def ongoing(broker: FakeBroker, tid: str, partitions: dict[str, list[int]]) -> tuple[int, int]:
    _, pid, epoch = await init(broker, tid)
    await add_partitions_to_txn.handle(broker, context(24, 3), add_v3(3, tid, pid, epoch, partitions))
    return pid, epoch


async def test_list_transactions_lists_every_id_with_kafkas_filters(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0, 0])
        open_pid, _ = await ongoing(broker, "open", {"t": [0]})
        _, idle_pid, _ = await init(broker, "idle")
        done_pid, done_epoch = await ongoing(broker, "done", {"t": [1]})
        ended = await end_txn.handle(broker, context(26, 3), request(
            26, 3, transactional_id="done", producer_id=done_pid, producer_epoch=done_epoch, committed=True))
        assert ended.error_code == ErrorCode.none
        everything = {"open": (open_pid, "Ongoing"), "idle": (idle_pid, "Empty"),
                      "done": (done_pid, "CompleteCommit")}
        assert await listed(broker, 0) == (ErrorCode.none, (), everything)
        assert await listed(broker, state_filters=("Ongoing", "CompleteCommit")) == (
            ErrorCode.none, (), {k: v for k, v in everything.items() if k != "idle"})
        assert await listed(broker, producer_id_filters=(idle_pid,)) == (ErrorCode.none, (), {
            "idle": (idle_pid, "Empty")})
        # Kafka's names are exact: an unknown one is echoed and matches nothing
        assert await listed(broker, state_filters=("ongoing", "Nope")) == (ErrorCode.none, ("ongoing", "Nope"), {})
        # v1: only transactions started more than duration_filter ms ago (an Empty id never started: -1)
        assert (await listed(broker, duration_filter=3_600_000))[2] == {"idle": (idle_pid, "Empty")}


async def describe(broker: FakeBroker, *tids: str) -> dict[str, dict[str, Any]]:
    answer = await describe_transactions.handle(broker, context(65, 0), request(65, 0, transactional_ids=tids))
    return {s.transactional_id: {
        "error": s.error_code, "state": s.transaction_state, "pid": s.producer_id, "epoch": s.producer_epoch,
        "timeout": ms(s.transaction_timeout), "start": from_datetime(s.transaction_start_time),
        "topics": {t.topic: list(t.partitions) for t in s.topics}} for s in answer.transaction_states}


async def test_describe_transactions_names_kafkas_states_and_the_open_partitions(tmp_path: Path) -> None:
    async with fake_broker(tmp_path, shards=2) as broker:
        await broker.topics.create("t", 3, [0, 0, 0])
        here = [f"txn-{i}" for i in range(100) if broker.placement.coordinator_of(f"txn-{i}") == 0]
        tid, idle = here[:2]
        pid, epoch = await ongoing(broker, tid, {"t": [2, 0]})
        await init(broker, idle)
        found = await describe(broker, tid, idle, "never-seen", group_not_coordinated_here(broker))
        assert found[tid]["start"] > 0
        assert {**found[tid], "start": "set"} == {
            "error": ErrorCode.none, "state": "Ongoing", "pid": pid, "epoch": epoch, "timeout": 60_000,
            "start": "set", "topics": {"t": [0, 2]}}
        assert {k: found[idle][k] for k in ("error", "state", "start", "topics")} == {
            "error": ErrorCode.none, "state": "Empty", "start": -1, "topics": {}}
        assert found["never-seen"]["error"] == ErrorCode.transactional_id_not_found
        assert found[group_not_coordinated_here(broker)]["error"] == ErrorCode.not_coordinator
        aborted = await end_txn.handle(broker, context(26, 3), request(
            26, 3, transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=False))
        assert aborted.error_code == ErrorCode.none
        after = (await describe(broker, tid))[tid]
        assert (after["state"], after["topics"]) == ("CompleteAbort", {})


async def test_describe_producers_answers_per_partition(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0, 0])
        broker.producers[("t", 0)] = [ActiveProducer(7, 2, 4, 1_000, 0, 12)]
        answer = await describe_producers.handle(broker, context(61, 0), request(61, 0, topics=(
            part(61, 0, "TopicRequest", name="t", partition_indexes=(0, 1, 9)),
            part(61, 0, "TopicRequest", name="nope", partition_indexes=(0,)))))
        got = {(t.name, p.partition_index): (p.error_code, [
            (a.producer_id, a.producer_epoch, a.last_sequence, a.last_timestamp, a.coordinator_epoch,
             a.current_txn_start_offset) for a in p.active_producers]) for t in answer.topics for p in t.partitions}
        assert got == {("t", 0): (ErrorCode.none, [(7, 2, 4, 1_000, 0, 12)]), ("t", 1): (ErrorCode.none, []),
                       ("t", 9): (ErrorCode.unknown_topic_or_partition, []),
                       ("nope", 0): (ErrorCode.unknown_topic_or_partition, [])}


def test_active_producers_come_from_the_producer_state() -> None:
    """Last sequence and timestamp of the last batch, the open transaction's first offset; a marker ends it and
    records its coordinator epoch and time (Kafka's ProducerStateEntry)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=1, producer_id=5,
                                        producer_epoch=1, base_sequence=0, batch_size=1 << 20)
    for i in range(3):
        builder.append(i, timestamp=1_000 + i, key=None, value=b"v", headers=[])
    header = read_header(bytearray(builder.build()))
    states = ProducerStates()
    states.record(header, 40).txn_first = 40
    assert active_producers(states) == [ActiveProducer(5, 1, 2, 1_002, -1, 40)]
    states.end_txn(5, 1, coordinator_epoch=3, timestamp_ms=2_000)
    assert active_producers(states) == [ActiveProducer(5, 1, 2, 2_000, 3, -1)]
    entry = states.entries[5]
    assert type(entry).from_value(entry.to_value()) == entry  # kept across an owner's restart


async def test_write_txn_markers_writes_each_marker_at_the_partitions_owner(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0, 0])
        answer = await write_txn_markers.handle(broker, context(27, 1), request(27, 1, markers=(
            part(27, 1, "WritableTxnMarker", producer_id=9, producer_epoch=3, transaction_result=False,
                 coordinator_epoch=4, topics=(
                     part(27, 1, "WritableTxnMarkerTopic", name="t", partition_indexes=(1, 5)),
                     part(27, 1, "WritableTxnMarkerTopic", name="nope", partition_indexes=(0,)))),)))
        (result,) = answer.markers
        assert result.producer_id == 9
        assert {(t.name, p.partition_index): p.error_code for t in result.topics for p in t.partitions} == {
            ("t", 1): ErrorCode.none, ("t", 5): ErrorCode.unknown_topic_or_partition,
            ("nope", 0): ErrorCode.unknown_topic_or_partition}
        buf = bytearray(broker.logs[("t", 1)].batches[-1][2])
        ((pos, header),) = split_batches(buf)
        assert header.is_control and (header.producer_id, header.producer_epoch) == (9, 3)
        assert marker_of(buf, pos, header).commit is False
        assert marker_of(buf, pos, header).coordinator_epoch == 4
