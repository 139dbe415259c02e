"""Group coordinators over a real (embedded) metadata store: durability of commits, restore after a restart,
fencing of a replaced coordinator, group deletion and offset retention."""

from __future__ import annotations

import asyncio
import time

from kafscale.cluster import keys
from kafscale.groups.consumer.group import ConsumerGroup, ConsumerSettings, Heartbeat, HeartbeatAnswer
from kafscale.groups.consumer.stored import consumer_group_records
from kafscale.groups.offsets import OffsetEntry
from kafscale.groups.registry import GroupRegistry
from kafscale.groups.state import GroupSettings, State
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.metadata_store import Compare, MetadataStoreError, Op, TxnResult

SESSION = 6000


async def registry(meta: EmbeddedStore, shard_id: int = 0) -> GroupRegistry:
    r = GroupRegistry(shard_id, meta, GroupSettings(), owns=lambda _g: True, offsets_retention_ms=60_000,
                      retention_check_interval_s=3600)
    await r.start()
    return r


def entry(offset: int) -> OffsetEntry:
    return OffsetEntry(offset, -1, "m", commit_ms=int(time.time() * 1000))


async def join_one(r: GroupRegistry, group_id: str) -> tuple[str, int]:
    """One member joins (v3: no MEMBER_ID_REQUIRED) and syncs; returns (member id, generation)."""
    coordinator = await r.get(group_id, create=True)
    assert coordinator is not None
    joined = await coordinator.join(member_id="", instance_id=None, client_id="c", client_host="/h",
                                    session_timeout_ms=SESSION, rebalance_timeout_ms=SESSION, protocol_type="consumer",
                                    protocols=[("range", b"meta")], require_known_member_id=False)
    synced = await coordinator.sync(member_id=joined.member_id, instance_id=None, generation=joined.generation,
                                    protocol_type=None, protocol_name=None, assignments={joined.member_id: b"mine"})
    assert synced.error == ErrorCode.none and synced.assignment == b"mine"
    return joined.member_id, joined.generation


async def test_commit_is_in_the_store_when_acknowledged_and_restored_after_restart(store: EmbeddedStore) -> None:
    r = await registry(store)
    member, generation = await join_one(r, "g/with/slashes")
    coordinator = await r.get("g/with/slashes")
    assert coordinator is not None
    parts = [("t", p, entry(p * 10)) for p in range(250)]  # more than one etcd transaction's worth
    assert set((await coordinator.commit(member, None, generation, parts)).values()) == {ErrorCode.none}
    stored = await store.range(keys.group_offsets("g/with/slashes"))
    assert len(stored) == 250
    await r.close()

    again = await registry(store)
    await asyncio.wait_for(again._loaded.wait(), 10)
    restored = again.groups["g/with/slashes"]
    assert restored.group.state is State.STABLE and restored.group.generation == generation
    assert restored.offsets[("t", 7)].offset == 70 and restored.offsets[("t", 7)].metadata == "m"
    assert restored.group.members[member].assignment == b"mine"
    assert await restored.heartbeat(member, None, generation) == ErrorCode.none
    await again.close()


async def test_concurrent_commits_share_transactions_and_each_is_durable_when_answered(store: EmbeddedStore) -> None:
    r = await registry(store)
    member, generation = await join_one(r, "busy")
    coordinator = await r.get("busy")
    assert coordinator is not None
    before = await store.revision()

    async def commit(p: int) -> ErrorCode:
        error = (await coordinator.commit(member, None, generation, [("t", p, entry(p))]))[("t", p)]
        assert (await store.get(keys.group_offset("busy", "t", p))) is not None  # durable before the answer
        return error

    assert await asyncio.gather(*(commit(p) for p in range(40))) == [ErrorCode.none] * 40
    transactions = await store.revision() - before  # one revision per transaction
    assert transactions < 40, f"{transactions} transactions for 40 concurrent commits"
    assert sorted(coordinator.offsets) == [("t", p) for p in range(40)]
    await r.close()


async def test_replaced_coordinator_cannot_write(store: EmbeddedStore) -> None:
    old = await registry(store, shard_id=0)
    member, generation = await join_one(old, "g")
    zombie = await old.get("g")
    assert zombie is not None
    new = await registry(store, shard_id=1)  # takes the coordinator epoch of every stored group
    await asyncio.wait_for(new._loaded.wait(), 10)
    assert "g" in new.groups
    assert await zombie.commit(member, None, generation, [("t", 0, entry(5))]) == {("t", 0): ErrorCode.not_coordinator}
    assert "g" not in old.groups and zombie.group.state is State.DEAD
    assert await store.get(keys.group_offset("g", "t", 0)) is None
    current = await new.get("g")
    assert current is not None
    assert await current.commit(member, None, generation, [("t", 0, entry(6))]) == {("t", 0): ErrorCode.none}
    kv = await store.get(keys.group_coordinator("g"))
    assert kv is not None and kv.value == {"epoch": 2, "shard": 1}
    await old.close()
    await new.close()


async def test_standalone_commits_and_unknown_groups(store: EmbeddedStore) -> None:
    r = await registry(store)
    assert await r.get("nothing") is None
    assert await store.get(keys.group_coordinator("nothing")) is None  # a lookup takes no coordinator key
    standalone = await r.get("simple", create=True)
    assert standalone is not None
    assert await standalone.commit("", None, -1, [("t", 0, entry(3))]) == {("t", 0): ErrorCode.none}
    record = await store.get(keys.group("simple"))
    assert record is not None and record.value["members"] == []
    assert [c.group_id for c in await r.all_groups()] == ["simple"]
    await r.close()


async def test_delete_group_needs_it_empty_and_removes_offsets(store: EmbeddedStore) -> None:
    r = await registry(store)
    member, generation = await join_one(r, "g")
    coordinator = await r.get("g")
    assert coordinator is not None
    await coordinator.commit(member, None, generation, [("t", 0, entry(5))])
    assert await coordinator.delete_group() == ErrorCode.non_empty_group
    assert await coordinator.leave([(member, None)]) == (ErrorCode.none, [ErrorCode.none])
    assert await coordinator.delete_group() == ErrorCode.none
    assert await store.range(keys.group_offsets("g")) == []
    assert await store.get(keys.group("g")) is None and "g" not in r.groups
    assert await r.get("g") is None
    await r.close()


async def test_offset_delete_keeps_offsets_an_active_group_may_read(store: EmbeddedStore) -> None:
    """A subscription that does not parse (join_one's metadata) tells nothing of what the group reads: as in Kafka,
    every topic counts as subscribed, so no offset goes until the group is Empty."""
    r = await registry(store)
    member, generation = await join_one(r, "g")
    coordinator = await r.get("g")
    assert coordinator is not None
    await coordinator.commit(member, None, generation, [("t", 0, entry(5)), ("u", 0, entry(6))])
    subscribed = {("u", 0): ErrorCode.group_subscribed_to_topic}
    assert await coordinator.delete_offsets([("u", 0)]) == (ErrorCode.none, subscribed)
    assert set(coordinator.offsets) == {("t", 0), ("u", 0)}
    await coordinator.leave([(member, None)])
    assert await coordinator.delete_offsets([("u", 0)]) == (ErrorCode.none, {("u", 0): ErrorCode.none})
    assert set(coordinator.offsets) == {("t", 0)}
    await r.close()


async def test_offsets_of_an_empty_group_expire_and_the_group_goes(store: EmbeddedStore) -> None:
    r = await registry(store)
    member, generation = await join_one(r, "g")
    coordinator = await r.get("g")
    assert coordinator is not None
    await coordinator.commit(member, None, generation, [("t", 0, entry(5))])
    await r.expire_offsets(int(time.time() * 1000) + 120_000)
    assert "g" in r.groups  # members still there: a subscribed topic's offsets stay
    await coordinator.leave([(member, None)])
    await r.expire_offsets(int(time.time() * 1000) + 30_000)
    assert "g" in r.groups  # Empty, but not for the whole retention yet
    await r.expire_offsets(int(time.time() * 1000) + 61_000)
    assert "g" not in r.groups and await store.get(keys.group("g")) is None
    await r.close()


async def test_session_expiry_runs_on_its_own_timer(store: EmbeddedStore) -> None:
    r = GroupRegistry(0, store, GroupSettings(min_session_timeout_ms=100), owns=lambda _g: True,
                      offsets_retention_ms=60_000, retention_check_interval_s=3600)
    await r.start()
    coordinator = await r.get("g", create=True)
    assert coordinator is not None
    joined = await coordinator.join(member_id="", instance_id=None, client_id="c", client_host="/h",
                                    session_timeout_ms=200, rebalance_timeout_ms=200, protocol_type="consumer",
                                    protocols=[("range", b"")], require_known_member_id=False)
    await coordinator.sync(member_id=joined.member_id, instance_id=None, generation=1, protocol_type=None,
                           protocol_name=None, assignments={})
    # The session (200 ms) runs out with nobody asking; the timer then stores the emptied group.
    deadline = time.monotonic() + 30
    while (record := await store.get(keys.group("g"))) is None or record.value["members"]:
        assert time.monotonic() < deadline, "the member's session never expired"
        await asyncio.sleep(0.05)
    assert coordinator.group.state is State.EMPTY and coordinator.group.generation == 2
    assert record is not None and record.value["members"] == [] and record.value["generation"] == 2
    await r.close()


async def test_groups_of_other_shards_get_not_coordinator(store: EmbeddedStore) -> None:
    r = GroupRegistry(0, store, GroupSettings(), owns=lambda g: g.startswith("mine"), offsets_retention_ms=60_000,
                      retention_check_interval_s=3600)
    await r.start()
    assert await r.lookup("theirs", create=True) == (ErrorCode.not_coordinator, None)
    error, coordinator = await r.lookup("mine", create=True)
    assert error == ErrorCode.none and coordinator is not None
    await r.close()
    assert (await r.lookup("mine"))[0] == ErrorCode.coordinator_not_available


async def consumer_beat(r: GroupRegistry, member: str, epoch: int, owned: dict[str, frozenset[int]] | None,
                        topics: tuple[str, ...] | None = None) -> HeartbeatAnswer:
    coordinator = await r.get("cg", create=True)
    assert coordinator is not None
    hb = Heartbeat(member_id=member, member_epoch=epoch, rebalance_timeout_ms=5_000, subscribed_names=topics,
                   owned=owned)
    return await coordinator.consumer_heartbeat(hb, {"t": 4}, 1)


class Writes:
    """The ops of every transaction a registry's coordinators commit."""

    def __init__(self, meta: EmbeddedStore) -> None:
        self.txns: list[list[Op]] = []
        original = meta.txn

        async def txn(compares: list[Compare], ops: list[Op]) -> TxnResult:
            self.txns.append(list(ops))
            return await original(compares, ops)
        meta.txn = txn  # type: ignore[method-assign]


async def test_a_consumer_group_stores_one_record_per_member_and_writes_only_what_changed(
        store: EmbeddedStore) -> None:
    writes = Writes(store)
    r = await registry(store)
    a = await consumer_beat(r, "a", 0, {}, ("t",))
    b = await consumer_beat(r, "b", 0, {}, ("t",))
    assert b.error == ErrorCode.none and b.member_epoch == 3
    members = await store.range(keys.group_members("cg"))
    assert [kv.key for kv in members] == [keys.group_member("cg", "a"), keys.group_member("cg", "b")]
    header = await store.get(keys.group("cg"))
    assert header is not None and header.value["epoch"] == 3 and "members" not in header.value
    # a learns of the new epoch and revokes half its partitions: its own record alone is written.
    writes.txns.clear()
    keep = {p for p in a.assignment["t"]} & set(members[0].value["target"]["t"])  # type: ignore[index]
    revoked = await consumer_beat(r, "a", 2, {"t": frozenset(a.assignment["t"])})  # type: ignore[index]
    assert revoked.member_epoch == 2 and revoked.assignment == {"t": frozenset(keep)}  # revoking first
    done = await consumer_beat(r, "a", 2, {"t": frozenset(keep)})
    assert done.error == ErrorCode.none and done.member_epoch == 3
    written = {op.key for txn in writes.txns for op in txn}
    assert written == {keys.group_member("cg", "a")}, written
    # A member leaving (epoch -1) deletes its record.
    assert (await consumer_beat(r, "b", -1, None)).error == ErrorCode.none
    assert [kv.key for kv in await store.range(keys.group_members("cg"))] == [keys.group_member("cg", "a")]
    await r.close()

    again = await registry(store, shard_id=1)
    await asyncio.wait_for(again._loaded.wait(), 10)
    restored = again.groups["cg"].group
    assert isinstance(restored, ConsumerGroup) and list(restored.members) == ["a"]
    assert restored.members["a"].assigned == {"t": frozenset(keep)} and restored.target["a"] == {"t": frozenset(keep)}
    await again.close()


async def test_a_consumer_group_stored_in_one_record_loads_and_moves_to_member_records(store: EmbeddedStore) -> None:
    g = ConsumerGroup("cg", ConsumerSettings(), 0)
    joined = g.heartbeat(0, Heartbeat(member_id="a", member_epoch=0, rebalance_timeout_ms=5_000,
                                      subscribed_names=("t",), owned={}), {"t": 4}, 1)
    records = consumer_group_records(g)
    header = records.pop(keys.group("cg"))
    old = {**header, "members": [{k: v for k, v in m.items() if k != "target"} for m in records.values()],
           "target": {m["id"]: m["target"] for m in records.values()}}
    await store.put(keys.group("cg"), old)  # as written before members had records of their own
    r = await registry(store)
    assert (await consumer_beat(r, "a", joined.member_epoch, {"t": frozenset(range(4))})).error == ErrorCode.none
    b = await consumer_beat(r, "b", 0, {}, ("t",))  # a change: the group is written in the new layout
    assert b.error == ErrorCode.none
    header_now = await store.get(keys.group("cg"))
    assert header_now is not None and "members" not in header_now.value and "target" not in header_now.value
    assert len(await store.range(keys.group_members("cg"))) == 2
    await r.close()


async def test_a_failed_group_write_is_written_again_with_the_next_change(store: EmbeddedStore) -> None:
    r = await registry(store)
    a = await consumer_beat(r, "a", 0, {}, ("t",))
    original = store.txn

    async def failing(compares: list[Compare], ops: list[Op]) -> TxnResult:
        raise MetadataStoreError("injected: the store did not answer")
    store.txn = failing  # type: ignore[method-assign]
    assert (await consumer_beat(r, "b", 0, {}, ("t",))).error == ErrorCode.coordinator_not_available
    store.txn = original  # type: ignore[method-assign]
    assert await store.get(keys.group_member("cg", "b")) is None
    # The next change is a's alone (it revokes); what the failed write held goes with it.
    revoking = await consumer_beat(r, "a", a.member_epoch, {"t": frozenset(range(4))})
    assert revoking.error == ErrorCode.none and revoking.assignment != a.assignment
    assert [kv.value["id"] for kv in await store.range(keys.group_members("cg"))] == ["a", "b"]
    header = await store.get(keys.group("cg"))
    coordinator = await r.get("cg")
    assert coordinator is not None and header is not None and header.value["epoch"] == coordinator.group.epoch == 3
    await r.close()
