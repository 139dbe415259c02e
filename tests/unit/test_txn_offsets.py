"""Transactional offsets at the group coordinator (kafscale/groups/txn_offsets.py): TxnOffsetCommit holds them
pending, durable, invisible to OffsetFetch; the transaction's end commits or drops them, idempotently; a
require_stable OffsetFetch sees UNSTABLE_OFFSET_COMMIT meanwhile. Over the embedded metadata store, through the
real handlers (no sockets)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from kafscale.acceptor.handlers import delete_groups, offset_commit, offset_fetch, txn_offset_commit
from kafscale.cluster import keys
from kafscale.groups.registry import GroupRegistry
from kafscale.groups.state import GroupSettings
from kafscale.protocol.codec import make, request_class
from kafscale.protocol.errors import ErrorCode
from kafscale.security.acl import AclBinding, Authorizer, Operation, PatternType, Permission, ResourceType
from kafscale.storage.embedded_store import EmbeddedStore
from tests.unit.fake_broker import FakeBroker, context, fake_broker
from tests.unit.test_group_coordinator import join_one

TXN = 28
Offsets = list[tuple[str, list[tuple[int, int]]]]  # [(topic, [(partition, offset)])]


def _part(api_key: int, version: int, entity: str, /, **fields: Any) -> Any:
    return make(getattr(sys.modules[request_class(api_key, version).__module__], entity), **fields)


async def _in_the_transaction(transactional_id: str, producer_id: int, producer_epoch: int,
                              partitions: list[tuple[str, int]], group_id: str | None = None,
                              add: bool = False) -> list[int]:
    return [0] * (len(partitions) + (group_id is not None))


async def txn_commit(broker: FakeBroker, offsets: Offsets, *, version: int = 4, group: str = "g",
                     producer_id: int = 7, epoch: int = 0, generation: int = -1, member: str = "",
                     instance: str | None = None, metadata: str = "m") -> dict[tuple[str, int], ErrorCode]:
    """These tests are about the group's side: the transaction's coordinator, asked first (KIP-890), says yes
    (tests/differential/test_transactions.py asks a real one)."""
    broker.verify_txn = _in_the_transaction  # type: ignore[method-assign]
    req = make(request_class(TXN, version), transactional_id="tx", group_id=group, producer_id=producer_id,
               producer_epoch=epoch, generation_id=generation, member_id=member, group_instance_id=instance,
               topics=tuple(_part(TXN, version, "TxnOffsetCommitRequestTopic", name=t, partitions=tuple(
                   _part(TXN, version, "TxnOffsetCommitRequestPartition", partition_index=p, committed_offset=o,
                         committed_leader_epoch=3, committed_metadata=metadata) for p, o in parts))
                   for t, parts in offsets))
    answer = await txn_offset_commit.handle(broker, context(TXN, version), req)
    return {(t.name, p.partition_index): p.error_code for t in answer.topics for p in t.partitions}


async def plain_commit(broker: FakeBroker, offsets: Offsets, group: str = "g") -> None:
    answer = await offset_commit.handle(broker, context(8, 8), make(
        request_class(8, 8), group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        topics=tuple(_part(8, 8, "OffsetCommitRequestTopic", name=t, partitions=tuple(
            _part(8, 8, "OffsetCommitRequestPartition", partition_index=p, committed_offset=o,
                  committed_leader_epoch=-1, committed_metadata="") for p, o in parts)) for t, parts in offsets)))
    assert all(p.error_code == ErrorCode.none for t in answer.topics for p in t.partitions)


async def fetch(broker: FakeBroker, partitions: list[int], *, stable: bool, version: int = 8, group: str = "g",
                topic: str = "t") -> tuple[ErrorCode, list[tuple[int, int, ErrorCode]]]:
    """(group error, [(partition, committed offset, error)]) of an OffsetFetch; v7 and v8 both have
    require_stable, in different shapes."""
    if version >= 8:
        req = make(request_class(9, 8), require_stable=stable, groups=(
            _part(9, 8, "OffsetFetchRequestGroup", group_id=group, topics=(
                _part(9, 8, "OffsetFetchRequestTopics", name=topic, partition_indexes=tuple(partitions)),)),))
        answer = (await offset_fetch.handle(broker, context(9, 8), req)).groups[0]
    else:
        req = make(request_class(9, version), group_id=group, require_stable=stable, topics=(
            _part(9, version, "OffsetFetchRequestTopic", name=topic, partition_indexes=tuple(partitions)),))
        answer = await offset_fetch.handle(broker, context(9, version), req)
    rows = [(p.partition_index, p.committed_offset, p.error_code) for t in answer.topics for p in t.partitions]
    return answer.error_code, rows


async def stored_pending(broker: FakeBroker, group: str = "g") -> list[Any]:
    return await broker.groups.meta.range(keys.group_txn_offsets(group))


# ---------------------------------------------------------------------------------------- commit and abort


async def test_pending_offsets_are_invisible_until_the_transaction_commits(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        await plain_commit(broker, [("t", [(0, 5)])])
        assert await txn_commit(broker, [("t", [(0, 10), (1, 20)])]) == {("t", 0): 0, ("t", 1): 0}
        assert len(await stored_pending(broker)) == 1  # durable before the answer

        assert await fetch(broker, [0, 1], stable=False) == (ErrorCode.none, [(0, 5, 0), (1, -1, 0)])
        coordinator = broker.groups.groups["g"]
        assert coordinator.offsets[("t", 0)].offset == 5

        assert await broker.groups.complete_txn_offsets("g", 7, 0, True) == ErrorCode.none
        assert await fetch(broker, [0, 1], stable=True) == (ErrorCode.none, [(0, 10, 0), (1, 20, 0)])
        committed = coordinator.offsets[("t", 1)]
        assert (committed.leader_epoch, committed.metadata) == (3, "m")
        assert await stored_pending(broker) == []
        assert len(await broker.groups.meta.range(keys.group_offsets("g"))) == 2


async def test_an_abort_drops_the_pending_offsets_and_keeps_the_committed_ones(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        await plain_commit(broker, [("t", [(0, 5)])])
        await txn_commit(broker, [("t", [(0, 10)])])
        assert await broker.groups.complete_txn_offsets("g", 7, 0, False) == ErrorCode.none
        assert await fetch(broker, [0], stable=True) == (ErrorCode.none, [(0, 5, 0)])
        assert await stored_pending(broker) == []


async def test_offsets_of_one_transaction_accumulate_and_a_later_one_of_a_partition_wins(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        await txn_commit(broker, [("t", [(0, 10)])])
        await txn_commit(broker, [("t", [(0, 11), (1, 30)])])
        assert await broker.groups.complete_txn_offsets("g", 7, 0, True) == ErrorCode.none
        assert await fetch(broker, [0, 1], stable=False) == (ErrorCode.none, [(0, 11, 0), (1, 30, 0)])


async def test_a_plain_commit_after_the_transactional_one_is_kept(tmp_path: Path) -> None:
    """Kafka keeps the later of the two commits of a partition."""
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        await txn_commit(broker, [("t", [(0, 10), (1, 10)])])
        await asyncio.sleep(0.01)  # acceptance times must differ
        await plain_commit(broker, [("t", [(0, 99)])])
        assert await broker.groups.complete_txn_offsets("g", 7, 0, True) == ErrorCode.none
        assert await fetch(broker, [0, 1], stable=False) == (ErrorCode.none, [(0, 99, 0), (1, 10, 0)])


async def test_completion_is_idempotent(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        await txn_commit(broker, [("t", [(0, 10)])])
        for _ in range(2):
            assert await broker.groups.complete_txn_offsets("g", 7, 0, True) == ErrorCode.none
        # an abort repeated after the commit: nothing pending, nothing undone
        assert await broker.groups.complete_txn_offsets("g", 7, 0, False) == ErrorCode.none
        assert await fetch(broker, [0], stable=True) == (ErrorCode.none, [(0, 10, 0)])
        # a producer with nothing here, a group that does not exist: nothing to do
        assert await broker.groups.complete_txn_offsets("g", 8, 0, True) == ErrorCode.none
        assert await broker.groups.complete_txn_offsets("nobody", 7, 0, True) == ErrorCode.none
        assert "nobody" not in broker.groups.groups


async def test_producer_epochs_fence_older_commits_and_stale_completions(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        assert await txn_commit(broker, [("t", [(0, 10)])], epoch=1) == {("t", 0): 0}
        # a fenced producer (older epoch) cannot add to it
        assert await txn_commit(broker, [("t", [(1, 66)])], epoch=0) == {("t", 1): ErrorCode.invalid_producer_epoch}
        # a completion from before this epoch must not complete it
        assert await broker.groups.complete_txn_offsets("g", 7, 0, True) == ErrorCode.invalid_producer_epoch
        assert len(await stored_pending(broker)) == 1
        # a newer epoch starts over: the older epoch's offsets can only be a zombie's
        assert await txn_commit(broker, [("t", [(1, 20)])], epoch=2) == {("t", 1): 0}
        # transaction version 2: the marker's epoch is one more than the transaction's
        assert await broker.groups.complete_txn_offsets("g", 7, 3, True) == ErrorCode.none
        assert await fetch(broker, [0, 1], stable=True) == (ErrorCode.none, [(0, -1, 0), (1, 20, 0)])


async def test_producers_of_one_group_complete_independently(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        await txn_commit(broker, [("t", [(0, 10)])], producer_id=1)
        await txn_commit(broker, [("t", [(1, 20)])], producer_id=2)
        assert await broker.groups.complete_txn_offsets("g", 1, 0, False) == ErrorCode.none
        assert await fetch(broker, [0, 1], stable=True) == (
            ErrorCode.none, [(0, -1, 0), (1, -1, ErrorCode.unstable_offset_commit)])
        assert await broker.groups.complete_txn_offsets("g", 2, 0, True) == ErrorCode.none
        assert await fetch(broker, [0, 1], stable=True) == (ErrorCode.none, [(0, -1, 0), (1, 20, 0)])


# ---------------------------------------------------------------------------------------- OffsetFetch


async def test_require_stable_answers_unstable_offset_commit_while_a_transaction_is_open(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        await plain_commit(broker, [("t", [(0, 5), (1, 6)])])
        await txn_commit(broker, [("t", [(0, 10)])])
        for version in (7, 8):
            assert await fetch(broker, [0, 1], stable=True, version=version) == (
                ErrorCode.none, [(0, -1, ErrorCode.unstable_offset_commit), (1, 6, 0)])
            assert await fetch(broker, [0, 1], stable=False, version=version) == (
                ErrorCode.none, [(0, 5, 0), (1, 6, 0)])
        # every partition (no topics named): the committed ones, the pending one unstable
        every = make(request_class(9, 8), require_stable=True, groups=(
            _part(9, 8, "OffsetFetchRequestGroup", group_id="g", topics=None),))
        answer = await offset_fetch.handle(broker, context(9, 8), every)
        rows = [(p.partition_index, p.committed_offset, p.error_code) for p in answer.groups[0].topics[0].partitions]
        assert rows == [(0, -1, ErrorCode.unstable_offset_commit), (1, 6, 0)]


async def test_require_stable_is_answered_by_the_coordinator_only(tmp_path: Path) -> None:
    async with fake_broker(tmp_path, shards=2) as broker:
        await broker.topics.create("t", 1, [0])
        elsewhere = next(g for g in (f"group-{i}" for i in range(100)) if broker.placement.coordinator_of(g) != 0)
        assert await fetch(broker, [0], stable=True, group=elsewhere) == (ErrorCode.not_coordinator, [])


# ---------------------------------------------------------------------------------------- durability


async def test_pending_offsets_survive_a_coordinator_reload_and_complete_there(tmp_path: Path) -> None:
    meta = EmbeddedStore(tmp_path / "meta.sqlite")
    try:
        broker = FakeBroker(meta)
        await broker.topics.start()
        await broker.groups.start()
        await broker.topics.create("t", 1, [0])
        await txn_commit(broker, [("t", [(0, 10)])], group="solo")  # a group that only stores offsets
        await broker.groups.close()

        again = GroupRegistry(0, meta, GroupSettings(), owns=lambda _g: True, offsets_retention_ms=60_000,
                              retention_check_interval_s=3600)
        await again.start()
        error, unstable = await again.unstable("solo")
        assert (error, unstable) == (ErrorCode.none, {("t", 0)})
        assert again.groups["solo"].offsets == {}
        assert await again.complete_txn_offsets("solo", 7, 0, True) == ErrorCode.none
        assert again.groups["solo"].offsets[("t", 0)].offset == 10
        await again.close()
        await broker.topics.stop()
    finally:
        await meta.close()


async def test_a_replaced_coordinator_cannot_write_pending_offsets(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        await txn_commit(broker, [("t", [(0, 10)])])
        zombie = broker.groups.groups["g"]
        successor = GroupRegistry(1, broker.groups.meta, GroupSettings(), owns=lambda _g: True,
                                  offsets_retention_ms=60_000, retention_check_interval_s=3600)
        assert await successor.get("g") is not None  # takes the coordinator epoch
        assert await txn_commit(broker, [("t", [(0, 11)])]) == {("t", 0): ErrorCode.not_coordinator}
        assert zombie.closed
        assert await successor.complete_txn_offsets("g", 7, 0, True) == ErrorCode.none
        assert successor.groups["g"].offsets[("t", 0)].offset == 10
        await successor.close()


async def test_deleting_the_group_deletes_its_pending_offsets(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        await txn_commit(broker, [("t", [(0, 10)])])
        answer = await delete_groups.handle(broker, context(42, 2), make(request_class(42, 2), groups_names=("g",)))
        assert answer.results[0].error_code == ErrorCode.none
        assert await stored_pending(broker) == []
        # the transaction ends afterwards: nothing left to complete, and no group comes back
        assert await broker.groups.complete_txn_offsets("g", 7, 0, True) == ErrorCode.none
        assert await broker.groups.meta.get(keys.group("g")) is None


async def test_retention_keeps_offsets_and_group_of_an_open_transaction_and_drops_abandoned_ones(
        tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        await plain_commit(broker, [("t", [(0, 5), (1, 6)])])
        await asyncio.sleep(0.01)  # the transaction starts after the commits' retention does
        await txn_commit(broker, [("t", [(0, 10)])])
        coordinator = broker.groups.groups["g"]
        started = coordinator.pending[7].started_ms
        retention = broker.groups.offsets_retention_ms
        # every committed offset is past retention, but the open transaction's partition keeps its offset
        await coordinator.expire_offsets(started + 1000, started + 1000 - coordinator.offsets[("t", 1)].commit_ms)
        assert set(coordinator.offsets) == {("t", 0)} and not coordinator.closed
        # a transaction older than retention never ends: dropped, and the group with it
        await coordinator.expire_offsets(started + retention, retention)
        assert coordinator.closed and await stored_pending(broker) == []
        assert await broker.groups.meta.get(keys.group("g")) is None


# ---------------------------------------------------------------------------------------- validation


async def test_unknown_topics_and_partitions_and_oversized_metadata_fail_alone(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        assert await txn_commit(broker, [("t", [(0, 1), (5, 1)]), ("nope", [(0, 1)])]) == {
            ("t", 0): 0, ("t", 5): ErrorCode.unknown_topic_or_partition,
            ("nope", 0): ErrorCode.unknown_topic_or_partition}
        assert await txn_commit(broker, [("t", [(0, 1)])], metadata="x" * 5000) == {
            ("t", 0): ErrorCode.offset_metadata_too_large}
        assert await txn_commit(broker, [("t", [(0, 1)])], group="") == {("t", 0): ErrorCode.invalid_group_id}


async def test_a_group_another_shard_coordinates_gets_not_coordinator(tmp_path: Path) -> None:
    async with fake_broker(tmp_path, shards=2) as broker:
        await broker.topics.create("t", 1, [0])
        elsewhere = next(g for g in (f"group-{i}" for i in range(100)) if broker.placement.coordinator_of(g) != 0)
        assert await txn_commit(broker, [("t", [(0, 1)])], group=elsewhere) == {("t", 0): ErrorCode.not_coordinator}


async def test_members_and_generations_are_checked_from_v3(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        member, generation = await join_one(broker.groups, "g")
        one = [("t", [(0, 1)])]
        assert await txn_commit(broker, one, generation=generation, member=member) == {("t", 0): 0}
        assert await txn_commit(broker, one, generation=generation + 1, member=member) == {
            ("t", 0): ErrorCode.illegal_generation}
        assert await txn_commit(broker, one, generation=generation, member="stranger") == {
            ("t", 0): ErrorCode.unknown_member_id}
        assert await txn_commit(broker, one, generation=generation, member=member, instance="i-1") == {
            ("t", 0): ErrorCode.unknown_member_id}  # no static member with that instance id
        # v0-v2 name no member: accepted into a group with members, as Kafka does
        assert await txn_commit(broker, one, version=2, producer_id=8) == {("t", 0): 0}
        assert await txn_commit(broker, one, version=0, producer_id=9) == {("t", 0): 0}
        # a generation for a group that does not exist
        assert await txn_commit(broker, one, group="new", generation=1, member="m") == {
            ("t", 0): ErrorCode.illegal_generation}


async def test_a_replaced_static_member_is_fenced(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        coordinator = await broker.groups.get("g", create=True)
        assert coordinator is not None
        joined = [await coordinator.join(
            member_id="", instance_id="i-1", client_id="c", client_host="/h", session_timeout_ms=6000,
            rebalance_timeout_ms=6000, protocol_type="consumer", protocols=[("range", b"")],
            require_known_member_id=False) for _ in range(2)]
        old, new = joined
        assert old.member_id != new.member_id
        answer = await txn_commit(broker, [("t", [(0, 1)])], generation=new.generation, member=old.member_id,
                                  instance="i-1")
        assert answer == {("t", 0): ErrorCode.fenced_instance_id}


async def test_acls_are_checked_in_kafkas_order(tmp_path: Path) -> None:
    def allow(resource: ResourceType, name: str, operation: Operation) -> AclBinding:
        return AclBinding(resource, name, PatternType.LITERAL, "User:*", "*", operation, Permission.ALLOW)

    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        await broker.topics.create("u", 1, [0])
        one = [("t", [(0, 1)]), ("u", [(0, 1)])]
        broker.acls.authorizer = Authorizer([allow(ResourceType.GROUP, "g", Operation.READ)])
        assert set((await txn_commit(broker, one)).values()) == {ErrorCode.transactional_id_authorization_failed}
        broker.acls.authorizer = Authorizer([allow(ResourceType.TRANSACTIONAL_ID, "tx", Operation.WRITE)])
        assert set((await txn_commit(broker, one)).values()) == {ErrorCode.group_authorization_failed}
        broker.acls.authorizer = Authorizer([allow(ResourceType.TRANSACTIONAL_ID, "tx", Operation.WRITE),
                                             allow(ResourceType.GROUP, "g", Operation.READ),
                                             allow(ResourceType.TOPIC, "t", Operation.READ)])
        assert await txn_commit(broker, one) == {("t", 0): 0, ("u", 0): ErrorCode.topic_authorization_failed}
