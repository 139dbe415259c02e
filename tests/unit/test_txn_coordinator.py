"""Transaction coordinators over a real (embedded) metadata store, with fake markers and group completion:
producer ids and epochs, fencing, adding partitions, commit and abort, aborts by a new producer and by timeout,
recovery of a prepared commit after a restart, and an incarnation fenced by another's write."""

from __future__ import annotations

import asyncio

from kafscale.cluster import keys
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.control import TxnMarker
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.transactions.coordinator import TxnSettings, now_ms
from kafscale.transactions.registry import TransactionRegistry
from kafscale.transactions.state import TxnMetadata, TxnState

TIMEOUT = 60_000


class Fakes:
    """The broker's side: producer ids, partitions that take markers, groups that settle offsets."""

    def __init__(self) -> None:
        self.next_pid = 1000
        self.markers: list[tuple[str, int, TxnMarker]] = []
        self.offsets: list[tuple[str, int, int, bool]] = []
        self.refusals = 0  # the next markers answer NOT_LEADER_OR_FOLLOWER (an owner moving)
        self.gate: asyncio.Event | None = None  # set: markers wait for it (a slow or dead partition)

    async def allocate(self) -> int:
        self.next_pid += 1
        return self.next_pid

    async def write_marker(self, topic: str, partition: int, marker: TxnMarker, timeout_ms: int) -> int:
        if self.gate is not None:
            await self.gate.wait()
        if self.refusals > 0:
            self.refusals -= 1
            return int(ErrorCode.not_leader_or_follower)
        self.markers.append((topic, partition, marker))
        return 0

    async def complete_offsets(self, group_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        self.offsets.append((group_id, producer_id, producer_epoch, commit))
        return 0


async def registry(meta: EmbeddedStore, fakes: Fakes, *, owns: bool = True, **settings: float) -> TransactionRegistry:
    r = TransactionRegistry(0, meta, TxnSettings(backoff_first_s=0.001, backoff_cap_s=0.01,
                                                 abort_check_interval_s=3600, **settings),  # type: ignore[arg-type]
                            owns=lambda _tid: owns, allocate_producer_id=fakes.allocate,
                            write_marker=fakes.write_marker, complete_offsets=fakes.complete_offsets)
    await r.start()
    await asyncio.wait_for(r.loaded.wait(), 10)
    return r


async def stored(meta: EmbeddedStore, tid: str) -> TxnMetadata | None:
    kv = await meta.get(keys.transaction(tid))
    return TxnMetadata.from_dict(tid, kv.value) if kv is not None else None


async def test_init_allocates_then_bumps_and_kip_360_retries_are_recognised(store: EmbeddedStore) -> None:
    fakes = Fakes()
    r = await registry(store, fakes)
    first = await r.init_producer_id("t/1", TIMEOUT)
    assert (first.error, first.producer_epoch) == (ErrorCode.none, 0) and first.producer_id == 1001
    second = await r.init_producer_id("t/1", TIMEOUT)
    assert (second.error, second.producer_id, second.producer_epoch) == (ErrorCode.none, 1001, 1)
    record = await stored(store, "t/1")
    assert record is not None and (record.state, record.producer_epoch, record.timeout_ms) == (
        TxnState.EMPTY, 1, TIMEOUT)
    # KIP-360: the current producer bumps its own epoch; a retry of that (the previous epoch) gets it again
    bumped = await r.init_producer_id("t/1", TIMEOUT, 1001, 1)
    assert (bumped.error, bumped.producer_epoch) == (ErrorCode.none, 2)
    retry = await r.init_producer_id("t/1", TIMEOUT, 1001, 1)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (ErrorCode.none, 1001, 2)
    assert (await r.init_producer_id("t/1", TIMEOUT, 1001, 0)).error == ErrorCode.producer_fenced
    assert (await r.init_producer_id("t/1", TIMEOUT, 77, 2)).error == ErrorCode.producer_fenced
    assert (await r.init_producer_id("t/1", TIMEOUT, 1001, -1)).error == ErrorCode.invalid_request
    assert (await r.init_producer_id("t/1", 900_001)).error == ErrorCode.invalid_transaction_timeout
    assert (await r.init_producer_id("t/1", 0)).error == ErrorCode.invalid_transaction_timeout
    assert (await r.init_producer_id("", TIMEOUT)).error == ErrorCode.invalid_request
    await r.close()


async def test_an_exhausted_epoch_takes_a_new_producer_id(store: EmbeddedStore) -> None:
    fakes = Fakes()
    await store.put(keys.transaction("t"), TxnMetadata("t", 5, 32766, TxnState.COMPLETE_COMMIT, TIMEOUT,
                                                       now_ms()).to_dict())
    r = await registry(store, fakes)
    result = await r.init_producer_id("t", TIMEOUT, 5, 32766)
    assert (result.error, result.producer_id, result.producer_epoch) == (ErrorCode.none, 1001, 0)
    record = await stored(store, "t")
    assert record is not None and (record.last_producer_id, record.last_producer_epoch) == (5, 32766)
    retry = await r.init_producer_id("t", TIMEOUT, 5, 32766)  # the answer was lost: the same again
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (ErrorCode.none, 1001, 0)
    await r.close()


async def test_add_partitions_checks_the_producer_and_writes_the_open_transaction(store: EmbeddedStore) -> None:
    fakes = Fakes()
    r = await registry(store, fakes)
    assert await r.add_partitions("t", 1, 0, [("a", 0)]) == ErrorCode.invalid_producer_id_mapping
    init = await r.init_producer_id("t", TIMEOUT)
    pid = init.producer_id
    await r.init_producer_id("t", TIMEOUT)  # epoch 1: epoch 0 is fenced
    assert await r.add_partitions("t", pid + 1, 1, [("a", 0)]) == ErrorCode.invalid_producer_id_mapping
    assert await r.add_partitions("t", pid, 0, [("a", 0)]) == ErrorCode.producer_fenced
    assert await r.add_partitions("t", pid, 1, [("a", 0), ("a", 1)]) == ErrorCode.none
    record = await stored(store, "t")
    assert record is not None and record.state is TxnState.ONGOING and record.partitions == {("a", 0), ("a", 1)}
    started = record.start_ms
    assert started > 0
    assert await r.add_partitions("t", pid, 1, [("b", 3)]) == ErrorCode.none
    assert await r.add_offsets("t", pid, 1, "g") == ErrorCode.none
    record = await stored(store, "t")
    assert record is not None and record.start_ms == started and record.groups == {"g"}
    assert record.partitions == {("a", 0), ("a", 1), ("b", 3)}
    verified = await r.verify_partitions("t", pid, 1, [("a", 1), ("c", 0)])
    assert verified == {("a", 1): ErrorCode.none, ("c", 0): ErrorCode.invalid_txn_state}
    assert await r.verify_partitions("t", pid, 0, [("a", 1)]) == {("a", 1): ErrorCode.producer_fenced}
    await r.close()


async def test_commit_writes_every_marker_and_the_groups_offsets_before_answering(store: EmbeddedStore) -> None:
    fakes = Fakes()
    fakes.refusals = 3  # an owner moving: the markers are retried
    r = await registry(store, fakes)
    pid = (await r.init_producer_id("t", TIMEOUT)).producer_id
    assert await r.add_partitions("t", pid, 0, [("a", 0), ("a", 1), ("b", 0)]) == ErrorCode.none
    assert await r.add_offsets("t", pid, 0, "g") == ErrorCode.none
    assert (await r.end_txn("t", pid, 0, commit=True)).error == ErrorCode.none
    assert sorted((t, p) for t, p, _ in fakes.markers) == [("a", 0), ("a", 1), ("b", 0)]
    assert {m for _, _, m in fakes.markers} == {TxnMarker(pid, 0, 0, True)}
    assert fakes.offsets == [("g", pid, 0, True)]
    record = await stored(store, "t")
    assert record is not None and record.state is TxnState.COMPLETE_COMMIT
    assert not record.partitions and not record.groups
    assert (await r.end_txn("t", pid, 0, commit=True)).error == ErrorCode.none  # a retry
    assert (await r.end_txn("t", pid, 0, commit=False)).error == ErrorCode.invalid_txn_state
    # the next transaction of the same producer
    assert await r.add_partitions("t", pid, 0, [("c", 0)]) == ErrorCode.none
    assert (await r.end_txn("t", pid, 0, commit=False)).error == ErrorCode.none
    assert fakes.markers[-1] == ("c", 0, TxnMarker(pid, 0, 0, False))
    assert (await r.end_txn("t", pid, 0, commit=False)).error == ErrorCode.none  # abort of CompleteAbort: a retry
    assert (await r.end_txn("t", pid, 0, commit=True)).error == ErrorCode.invalid_txn_state
    assert (await r.end_txn("t", pid, 1, commit=True)).error == ErrorCode.producer_fenced
    await r.close()


async def test_end_txn_with_no_transaction_is_invalid_txn_state(store: EmbeddedStore) -> None:
    r = await registry(store, Fakes())
    pid = (await r.init_producer_id("t", TIMEOUT)).producer_id
    assert (await r.end_txn("t", pid, 0, commit=True)).error == ErrorCode.invalid_txn_state
    assert (await r.end_txn("nobody", pid, 0, commit=True)).error == ErrorCode.invalid_producer_id_mapping
    await r.close()


async def test_init_producer_id_aborts_the_open_transaction_of_the_previous_producer(store: EmbeddedStore) -> None:
    fakes = Fakes()
    r = await registry(store, fakes)
    pid = (await r.init_producer_id("t", TIMEOUT)).producer_id
    assert await r.add_partitions("t", pid, 0, [("a", 0)]) == ErrorCode.none
    assert await r.add_offsets("t", pid, 0, "g") == ErrorCode.none
    successor = await r.init_producer_id("t", TIMEOUT)
    # the abort carries epoch 1 (fencing epoch 0 in the partitions); the new producer gets epoch 2
    assert (successor.error, successor.producer_id, successor.producer_epoch) == (ErrorCode.none, pid, 2)
    assert fakes.markers == [("a", 0, TxnMarker(pid, 1, 0, False))]
    assert fakes.offsets == [("g", pid, 1, False)]
    assert (await r.end_txn("t", pid, 0, commit=True)).error == ErrorCode.producer_fenced
    assert await r.add_partitions("t", pid, 0, [("a", 0)]) == ErrorCode.producer_fenced
    record = await stored(store, "t")
    assert record is not None and (record.state, record.producer_epoch) == (TxnState.EMPTY, 2)
    await r.close()


async def test_requests_while_markers_are_in_flight_get_concurrent_transactions(store: EmbeddedStore) -> None:
    fakes = Fakes()
    r = await registry(store, fakes, busy_wait_s=0.05)
    pid = (await r.init_producer_id("t", TIMEOUT)).producer_id
    assert await r.add_partitions("t", pid, 0, [("a", 0)]) == ErrorCode.none
    fakes.gate = asyncio.Event()
    ending = asyncio.ensure_future(r.end_txn("t", pid, 0, commit=True))
    await asyncio.sleep(0.05)
    assert not ending.done()  # EndTxn answers only once the markers are written
    assert await r.add_partitions("t", pid, 0, [("a", 1)]) == ErrorCode.concurrent_transactions
    assert (await r.end_txn("t", pid, 0, commit=True)).error == ErrorCode.concurrent_transactions
    assert (await r.end_txn("t", pid, 0, commit=False)).error == ErrorCode.invalid_txn_state
    assert (await r.init_producer_id("t", TIMEOUT)).error == ErrorCode.concurrent_transactions
    fakes.gate.set()
    assert (await asyncio.wait_for(ending, 5)).error == ErrorCode.none
    assert (await r.init_producer_id("t", TIMEOUT)).producer_epoch == 1
    await r.close()


async def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(store: EmbeddedStore) -> None:
    fakes = Fakes()
    r = await registry(store, fakes)
    pid = (await r.init_producer_id("t", 1000)).producer_id
    assert await r.add_partitions("t", pid, 0, [("a", 0)]) == ErrorCode.none
    assert await r.abort_timed_out(now_ms()) == []  # not yet
    assert await r.abort_timed_out(now_ms() + 2000) == ["t"]
    entry = r.coordinator.entries["t"]
    assert entry.finisher is not None and await asyncio.wait_for(entry.finisher, 5)
    assert fakes.markers == [("a", 0, TxnMarker(pid, 1, 0, False))]
    record = await stored(store, "t")
    assert record is not None and (record.state, record.producer_epoch) == (TxnState.COMPLETE_ABORT, 1)
    assert await r.add_partitions("t", pid, 0, [("a", 0)]) == ErrorCode.producer_fenced
    assert (await r.end_txn("t", pid, 0, commit=True)).error == ErrorCode.producer_fenced
    await r.close()


async def test_idle_transactional_ids_expire_and_open_ones_do_not(store: EmbeddedStore) -> None:
    r = await registry(store, Fakes(), id_expiration_ms=1000)
    await r.init_producer_id("idle", TIMEOUT)
    pid = (await r.init_producer_id("busy", TIMEOUT)).producer_id
    assert await r.add_partitions("busy", pid, 0, [("a", 0)]) == ErrorCode.none
    assert await r.expire(now_ms()) == []
    assert await r.expire(now_ms() + 5000) == ["idle"]
    assert await stored(store, "idle") is None and await stored(store, "busy") is not None
    assert "idle" not in r.coordinator.entries
    assert (await r.init_producer_id("idle", TIMEOUT)).producer_epoch == 0  # a new id again
    await r.close()


async def test_a_prepared_commit_is_finished_by_the_next_incarnation(store: EmbeddedStore) -> None:
    fakes = Fakes()
    fakes.gate = asyncio.Event()  # the partitions never answer this incarnation: it dies before the markers
    first = await registry(store, fakes)
    pid = (await first.init_producer_id("t", TIMEOUT)).producer_id
    assert await first.add_partitions("t", pid, 0, [("a", 0), ("b", 1)]) == ErrorCode.none
    assert await first.add_offsets("t", pid, 0, "g") == ErrorCode.none
    ending = asyncio.ensure_future(first.end_txn("t", pid, 0, commit=True))
    await asyncio.sleep(0.05)
    record = await stored(store, "t")
    assert record is not None and (record.state, record.coordinator_epoch) == (TxnState.PREPARE_COMMIT, 0)
    await first.close()
    assert (await ending).error == ErrorCode.not_coordinator  # the client looks for the coordinator again

    survivor = Fakes()
    second = await registry(store, survivor)
    entry = second.coordinator.entries["t"]
    assert entry.finisher is not None and await asyncio.wait_for(entry.finisher, 5)
    assert sorted((t, p, m) for t, p, m in survivor.markers) == [
        ("a", 0, TxnMarker(pid, 0, 1, True)), ("b", 1, TxnMarker(pid, 0, 1, True))]  # coordinator epoch 1
    assert survivor.offsets == [("g", pid, 0, True)]
    record = await stored(store, "t")
    assert record is not None and (record.state, record.coordinator_epoch) == (TxnState.COMPLETE_COMMIT, 1)
    assert (await second.end_txn("t", pid, 0, commit=True)).error == ErrorCode.none  # the client's retry
    await second.close()


async def test_a_coordinator_overtaken_by_another_incarnation_cannot_write(store: EmbeddedStore) -> None:
    fakes = Fakes()
    old = await registry(store, fakes)
    pid = (await old.init_producer_id("t", TIMEOUT)).producer_id
    new = await registry(store, fakes)  # the slot moved (or the shard restarted) while the old one still runs
    assert await new.add_partitions("t", pid, 0, [("a", 0)]) == ErrorCode.none
    # the old incarnation's copy is stale: its write fails, and it answers NOT_COORDINATOR
    assert await old.add_partitions("t", pid, 0, [("b", 0)]) == ErrorCode.not_coordinator
    record = await stored(store, "t")
    assert record is not None and record.partitions == {("a", 0)} and record.coordinator_epoch == 1
    await old.close()
    await new.close()


async def test_ids_of_another_shard_and_a_closed_registry_are_refused(store: EmbeddedStore) -> None:
    elsewhere = await registry(store, Fakes(), owns=False)
    assert (await elsewhere.init_producer_id("t", TIMEOUT)).error == ErrorCode.not_coordinator
    assert (await elsewhere.end_txn("t", 1, 0, commit=True)).error == ErrorCode.not_coordinator
    await elsewhere.close()
    assert await elsewhere.add_partitions("t", 1, 0, [("a", 0)]) == ErrorCode.coordinator_not_available


# ---------------------------------------------------------------- transactions v2 (KIP-890 part 2, EndTxn v5+)


async def test_v2_endings_bump_the_epoch_which_the_markers_carry_and_the_answer_tells(store: EmbeddedStore) -> None:
    fakes = Fakes()
    r = await registry(store, fakes)
    pid = (await r.init_producer_id("t", TIMEOUT)).producer_id
    assert await r.add_partitions("t", pid, 0, [("a", 0)]) == ErrorCode.none
    assert await r.add_offsets("t", pid, 0, "g") == ErrorCode.none
    done = await r.end_txn("t", pid, 0, commit=True, v2=True)
    assert (done.error, done.producer_id, done.producer_epoch) == (ErrorCode.none, pid, 1)
    assert fakes.markers == [("a", 0, TxnMarker(pid, 1, 0, True))]  # the bumped epoch fences epoch 0 there
    assert fakes.offsets == [("g", pid, 1, True)]
    record = await stored(store, "t")
    assert record is not None and (record.state, record.producer_epoch, record.last_producer_epoch) == (
        TxnState.COMPLETE_COMMIT, 1, 0)
    # the answer was lost: the producer retries with the epoch it had, and is told the same
    retry = await r.end_txn("t", pid, 0, commit=True, v2=True)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (ErrorCode.none, pid, 1)
    assert (await r.end_txn("t", pid, 0, commit=False, v2=True)).error == ErrorCode.invalid_txn_state
    # the next transaction goes on at epoch 1; epoch 0 is fenced from now on
    assert await r.add_partitions("t", pid, 0, [("a", 0)]) == ErrorCode.producer_fenced
    assert await r.add_partitions("t", pid, 1, [("b", 0)]) == ErrorCode.none
    aborted = await r.end_txn("t", pid, 1, commit=False, v2=True)
    assert (aborted.error, aborted.producer_epoch) == (ErrorCode.none, 2)
    assert fakes.markers[-1] == ("b", 0, TxnMarker(pid, 2, 0, False))
    assert len(fakes.markers) == 2
    await r.close()


async def test_v2_aborts_with_nothing_open_bump_the_epoch_and_commits_do_not_pass(store: EmbeddedStore) -> None:
    fakes = Fakes()
    r = await registry(store, fakes)
    pid = (await r.init_producer_id("t", TIMEOUT)).producer_id
    assert (await r.end_txn("t", pid, 0, commit=True, v2=True)).error == ErrorCode.invalid_txn_state
    empty = await r.end_txn("t", pid, 0, commit=False, v2=True)  # how a v2 producer recovers from an error
    assert (empty.error, empty.producer_id, empty.producer_epoch) == (ErrorCode.none, pid, 1)
    assert fakes.markers == []
    again = await r.end_txn("t", pid, 1, commit=False, v2=True)  # another, at the new epoch: a new empty abort
    assert (again.error, again.producer_epoch) == (ErrorCode.none, 2)
    assert (await r.end_txn("t", pid, 1, commit=True, v2=True)).error == ErrorCode.invalid_txn_state
    assert (await r.end_txn("t", pid, 5, commit=False, v2=True)).error == ErrorCode.producer_fenced
    assert (await r.end_txn("t", pid + 1, 2, commit=False, v2=True)).error == ErrorCode.invalid_producer_id_mapping
    await r.close()


async def test_a_v2_ending_at_the_last_epoch_moves_the_producer_to_a_new_id(store: EmbeddedStore) -> None:
    fakes = Fakes()
    await store.put(keys.transaction("t"), TxnMetadata("t", 5, 32766, TxnState.ONGOING, TIMEOUT, now_ms(),
                                                       partitions=frozenset({("a", 0)}), start_ms=now_ms()).to_dict())
    r = await registry(store, fakes)
    done = await r.end_txn("t", 5, 32766, commit=True, v2=True)
    assert (done.error, done.producer_id, done.producer_epoch) == (ErrorCode.none, 1001, 0)
    assert fakes.markers == [("a", 0, TxnMarker(5, 32767, 1, True))]  # the old id, at its last epoch
    record = await stored(store, "t")
    assert record is not None and (record.producer_id, record.producer_epoch, record.last_producer_id) == (1001, 0, 5)
    retry = await r.end_txn("t", 5, 32766, commit=True, v2=True)  # the answer was lost
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (ErrorCode.none, 1001, 0)
    assert await r.add_partitions("t", 1001, 0, [("a", 0)]) == ErrorCode.none
    await r.close()


async def test_a_v2_producer_whose_transaction_timed_out_may_abort_and_go_on(store: EmbeddedStore) -> None:
    """The coordinator aborts a transaction past its timeout at the next epoch; the producer's EndTxn at the old
    one is taken for a retry of that abort (Kafka's rule for v2): abort answers NONE with the epoch to go on with,
    commit INVALID_TXN_STATE. After an InitProducerId the old epoch is fenced instead."""
    fakes = Fakes()
    r = await registry(store, fakes)
    pid = (await r.init_producer_id("t", 1000)).producer_id
    assert await r.add_partitions("t", pid, 0, [("a", 0)]) == ErrorCode.none
    assert await r.abort_timed_out(now_ms() + 2000) == ["t"]
    entry = r.coordinator.entries["t"]
    assert entry.finisher is not None and await asyncio.wait_for(entry.finisher, 5)
    record = await stored(store, "t")
    assert record is not None and (record.state, record.producer_epoch) == (TxnState.COMPLETE_ABORT, 1)
    assert (await r.end_txn("t", pid, 0, commit=True, v2=True)).error == ErrorCode.invalid_txn_state
    aborted = await r.end_txn("t", pid, 0, commit=False, v2=True)
    assert (aborted.error, aborted.producer_id, aborted.producer_epoch) == (ErrorCode.none, pid, 1)
    assert (await r.init_producer_id("t", TIMEOUT)).producer_epoch == 2
    assert (await r.end_txn("t", pid, 1, commit=False, v2=True)).error == ErrorCode.producer_fenced
    await r.close()
