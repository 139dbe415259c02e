"""The transactional APIs' handlers against the fake broker (real transaction registry, markers into the fake
logs): request shapes of every version, Kafka's per-partition errors and the version-dependent fencing code."""

from __future__ import annotations

from pathlib import Path

from kafscale.acceptor.handlers import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    end_txn,
    find_coordinator,
    init_producer_id,
)
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.batch import split_batches
from tests.unit.fake_broker import FakeBroker, context, fake_broker
from tests.unit.test_handlers import part, request


async def init(broker: FakeBroker, tid: str, version: int = 4, **fields: int) -> tuple[int, int, int]:
    answer = await init_producer_id.handle(broker, context(22, version), request(
        22, version, transactional_id=tid, transaction_timeout=60_000, **fields))
    return answer.error_code, answer.producer_id, answer.producer_epoch


def add_v3(version: int, tid: str, pid: int, epoch: int, topics: dict[str, list[int]]) -> object:
    return request(24, version, v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                   v3_and_below_producer_epoch=epoch, v3_and_below_topics=tuple(
                       part(24, version, "AddPartitionsToTxnTopic", name=t, partitions=tuple(ps))
                       for t, ps in topics.items()))


def errors_v3(answer: object) -> dict[tuple[str, int], ErrorCode]:
    return {(t.name, p.partition_index): p.partition_error_code
            for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition}  # type: ignore[attr-defined]


async def test_a_transaction_through_the_handlers_commits_with_markers_in_the_logs(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0, 0])
        code, pid, epoch = await init(broker, "app-1")
        assert (code, epoch) == (ErrorCode.none, 0)
        added = await add_partitions_to_txn.handle(broker, context(24, 3), add_v3(3, "app-1", pid, epoch,
                                                                                  {"t": [0, 1]}))
        assert errors_v3(added) == {("t", 0): ErrorCode.none, ("t", 1): ErrorCode.none}
        offsets = await add_offsets_to_txn.handle(broker, context(25, 3), request(
            25, 3, transactional_id="app-1", producer_id=pid, producer_epoch=epoch, group_id="g"))
        assert offsets.error_code == ErrorCode.none
        ended = await end_txn.handle(broker, context(26, 3), request(
            26, 3, transactional_id="app-1", producer_id=pid, producer_epoch=epoch, committed=True))
        assert ended.error_code == ErrorCode.none
        for p in (0, 1):
            (_, header), = split_batches(bytearray(broker.logs[("t", p)].batches[-1][2]))
            assert header.is_control and header.producer_id == pid


async def test_add_partitions_fails_the_whole_request_for_one_unknown_partition(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        _, pid, epoch = await init(broker, "x")
        answer = await add_partitions_to_txn.handle(broker, context(24, 3), add_v3(3, "x", pid, epoch, {
            "t": [0, 5], "nope": [0]}))
        assert errors_v3(answer) == {("t", 0): ErrorCode.operation_not_attempted,
                                     ("t", 5): ErrorCode.unknown_topic_or_partition,
                                     ("nope", 0): ErrorCode.unknown_topic_or_partition}


async def test_older_versions_hear_invalid_producer_epoch_where_newer_ones_hear_producer_fenced(
        tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        _, pid, _ = await init(broker, "x")
        await init(broker, "x")  # epoch 1 fences epoch 0
        old = await add_partitions_to_txn.handle(broker, context(24, 1), add_v3(1, "x", pid, 0, {"t": [0]}))
        new = await add_partitions_to_txn.handle(broker, context(24, 2), add_v3(2, "x", pid, 0, {"t": [0]}))
        assert errors_v3(old) == {("t", 0): ErrorCode.invalid_producer_epoch}
        assert errors_v3(new) == {("t", 0): ErrorCode.producer_fenced}
        assert (await init(broker, "x", 3, producer_id=pid, producer_epoch=0))[0] == ErrorCode.invalid_producer_epoch
        assert (await init(broker, "x", 4, producer_id=pid, producer_epoch=0))[0] == ErrorCode.producer_fenced
        for version, code in ((1, ErrorCode.invalid_producer_epoch), (2, ErrorCode.producer_fenced)):
            ended = await end_txn.handle(broker, context(26, version), request(
                26, version, transactional_id="x", producer_id=pid, producer_epoch=0, committed=True))
            assert ended.error_code == code


async def test_verify_only_batches_answer_per_transaction_without_adding(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0, 0])
        _, pid, epoch = await init(broker, "x")
        await add_partitions_to_txn.handle(broker, context(24, 3), add_v3(3, "x", pid, epoch, {"t": [0]}))

        def txn(verify_only: bool) -> object:
            return part(24, 4, "AddPartitionsToTxnTransaction", transactional_id="x", producer_id=pid,
                        producer_epoch=epoch, verify_only=verify_only, topics=(
                            part(24, 4, "AddPartitionsToTxnTopic", name="t", partitions=(0, 1)),))

        answer = await add_partitions_to_txn.handle(broker, context(24, 4), request(24, 4, transactions=(txn(True),)))
        assert answer.error_code == ErrorCode.none
        (result,) = answer.results_by_transaction
        assert result.transactional_id == "x"
        assert {(t.name, p.partition_index): p.partition_error_code for t in result.topic_results
                for p in t.results_by_partition} == {("t", 0): ErrorCode.none, ("t", 1): ErrorCode.invalid_txn_state}
        meta = (await broker.transactions.describe("x"))[1]
        assert meta is not None and meta.partitions == {("t", 0)}  # verification added nothing


async def test_find_coordinator_names_the_transaction_coordinator(tmp_path: Path) -> None:
    async with fake_broker(tmp_path, shards=3) as broker:
        answer = await find_coordinator.handle(broker, context(10, 4), request(10, 4, key_type=1,
                                                                               coordinator_keys=("a", "b")))
        assert [(c.key, c.node_id, c.error_code) for c in answer.coordinators] == [
            (k, broker.placement.coordinator_of(k), ErrorCode.none) for k in ("a", "b")]
        elsewhere = next(t for t in (f"t{i}" for i in range(100)) if broker.placement.coordinator_of(t) != 0)
        assert (await init(broker, elsewhere))[0] == ErrorCode.not_coordinator
