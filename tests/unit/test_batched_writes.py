"""A group coordinator's batched writes: one transaction in flight, the rest batched behind it, in order, each key
once per transaction, failures given to exactly the writes of the failed transaction. Over a real (embedded)
metadata store; the one fault injected is a failing transaction, which the store cannot be made to produce."""

from __future__ import annotations

import asyncio

import pytest

from kafscale.groups.batched_writes import BatchedWrites
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.metadata_store import Delete, MetadataStoreError, Op, Put


class Recorder:
    """Writes each transaction to the store after `gate` opens; remembers the transactions; fails on demand."""

    def __init__(self, meta: EmbeddedStore) -> None:
        self.meta = meta
        self.txns: list[list[Op]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = False

    async def write(self, ops: list[Op]) -> None:
        self.txns.append(ops)
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise MetadataStoreError("injected")
        assert (await self.meta.txn([], ops)).succeeded


async def value(meta: EmbeddedStore, key: str) -> object:
    kv = await meta.get(key)
    return None if kv is None else kv.value


async def test_writes_arriving_during_a_transaction_go_together_in_the_next(store: EmbeddedStore) -> None:
    rec = Recorder(store)
    writes = BatchedWrites(rec.write)
    rec.gate.clear()
    first = writes.submit([Put("a", 1)])
    await asyncio.sleep(0)  # the first transaction is now in flight, held at the gate
    later = [writes.submit([Put(f"k{i}", i)]) for i in range(10)]
    rec.gate.set()
    await asyncio.gather(first, *later)
    assert [len(t) for t in rec.txns] == [1, 10]
    assert [await value(store, f"k{i}") for i in range(10)] == list(range(10))


async def test_a_key_written_twice_in_one_batch_holds_the_later_value(store: EmbeddedStore) -> None:
    rec = Recorder(store)
    writes = BatchedWrites(rec.write)
    rec.gate.clear()
    first = writes.submit([Put("x", 0)])
    await asyncio.sleep(0)
    a, b, c = writes.submit([Put("g", "old"), Put("o", 1)]), writes.submit([Put("g", "new")]), \
        writes.submit([Delete("o")])
    rec.gate.set()
    await asyncio.gather(first, a, b, c)
    assert len(rec.txns) == 2 and sorted(op.key for op in rec.txns[1]) == ["g", "o"]
    assert await value(store, "g") == "new" and await value(store, "o") is None


async def test_memory_is_applied_in_submission_order_and_only_once_durable(store: EmbeddedStore) -> None:
    rec = Recorder(store)
    writes = BatchedWrites(rec.write)
    applied: list[int] = []
    rec.gate.clear()
    done = [writes.submit([Put("p", i)], lambda i=i: applied.append(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    assert applied == []  # nothing is durable yet
    rec.gate.set()
    await asyncio.gather(*done)
    assert applied == [0, 1, 2, 3, 4] and await value(store, "p") == 4


async def test_a_failed_transaction_fails_its_writes_only(store: EmbeddedStore) -> None:
    rec = Recorder(store)
    writes = BatchedWrites(rec.write)
    applied: list[str] = []
    rec.gate.clear()
    rec.fail_next = True
    failing = writes.submit([Put("f", 1)], lambda: applied.append("f"))
    await asyncio.sleep(0)
    after = writes.submit([Put("s", 2)], lambda: applied.append("s"))
    rec.gate.set()
    with pytest.raises(MetadataStoreError):
        await failing
    await after
    assert applied == ["s"] and await value(store, "f") is None and await value(store, "s") == 2


async def test_written_waits_for_everything_submitted_before_and_reports_its_outcome(store: EmbeddedStore) -> None:
    rec = Recorder(store)
    writes = BatchedWrites(rec.write)
    assert writes.idle and writes.written().done()  # nothing submitted: nothing to wait for
    rec.gate.clear()
    rec.fail_next = True
    writes.submit([Put("a", 1)]).add_done_callback(lambda f: f.exception())
    assert not writes.idle
    barrier = writes.written()
    await asyncio.sleep(0.01)
    assert not barrier.done()
    rec.gate.set()
    with pytest.raises(MetadataStoreError):
        await barrier
    await writes.submit([Put("b", 1)])
    await writes.written()
    assert writes.idle


async def test_prefix_deletes_and_oversized_writes_go_alone_in_order(store: EmbeddedStore) -> None:
    rec = Recorder(store)
    writes = BatchedWrites(rec.write, max_ops=4)
    rec.gate.clear()
    first = writes.submit([Put("x", 0)])
    await asyncio.sleep(0)
    small = writes.submit([Put("g/a", 1)])
    wipe = writes.submit([Delete("g/", prefix=True)])
    big = writes.submit([Put(f"g/{i}", i) for i in range(10)])
    tail = writes.submit([Put("y", 1)])
    rec.gate.set()
    await asyncio.gather(first, small, wipe, big, tail)
    assert [len(t) for t in rec.txns] == [1, 1, 1, 4, 4, 2, 1]
    assert await value(store, "g/a") is None and await value(store, "g/9") == 9 and await value(store, "y") == 1
