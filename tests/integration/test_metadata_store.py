"""One conformance suite for every MetadataStore backend.

embedded: EmbeddedStore on a temporary SQLite file; etcd: EtcdStore on the session's real etcd, under a
key prefix of its own; remote: RemoteMetadataStore -> MetadataStoreActor (hosting an EmbeddedStore)
on the session's local Ray, through the actor's direct channel; remote-ray: the same with Ray calls
only. Backend-specific behaviour (etcd server restarts, the embedded file) is tested at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.etcd_store import EtcdStore
from kafscale.storage.metadata_store import (
    CompactedError,
    Compare,
    Delete,
    Get,
    KeyValue,
    MetadataStore,
    MetadataStoreError,
    Put,
    WatchEvent,
)
from kafscale.storage.metadata_stores import metadata_store_from_settings
from kafscale.storage.mirror import Mirror
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.ports import free_port

T = TypeVar("T")

# remote: through the actor's direct channel (a client on its node); remote-ray: every call a Ray call.
BACKENDS = ["embedded", pytest.param("etcd", marks=pytest.mark.etcd), "remote", "remote-ray"]
TTL = 1  # seconds; etcd's floor is 1.5 election timeouts rounded up: 1 s with EtcdServer's raft timing


# ---------------------------------------------------------------------------------------------- harness


class Backend:
    """Opens stores on one backend's data; reopen() is the backend's notion of a restart."""

    def __init__(self, name: str, tmp_path: Path, env: Any) -> None:
        self.name = name
        self.tmp_path = tmp_path
        self.env = env  # the EtcdServer for "etcd", the ray module for "remote"
        self.prefix = f"/conformance-{uuid.uuid4().hex[:12]}/"  # etcd: one namespace per test
        self.actor: Any = None
        self.stores: list[MetadataStore] = []

    async def open(self) -> MetadataStore:
        store: MetadataStore
        if self.name == "embedded":
            store = EmbeddedStore(self.tmp_path / "metadata.db")
        elif self.name == "etcd":
            store = EtcdStore(self.env.endpoint, prefix=self.prefix)
        else:
            from kafscale.actors.metadata_actor import MetadataStoreActor, RemoteMetadataStore

            if self.actor is None:
                self.actor = MetadataStoreActor.remote(data_dir=str(self.tmp_path))
                await self.actor.ready.remote()
            store = RemoteMetadataStore(self.actor, poll_timeout=2.0, direct=self.name == "remote")
        self.stores.append(store)
        return store

    async def reopen(self, store: MetadataStore) -> MetadataStore:
        """Close store (and for remote, the actor hosting the file) and open the same data again."""
        await store.close()
        if self.actor is not None:
            await self._drop_actor()
        return await self.open()

    async def _drop_actor(self) -> None:
        await self.actor.close.remote()  # releases the file before the process goes
        self.env.kill(self.actor)
        self.actor = None

    async def aclose(self) -> None:
        for store in self.stores:
            with contextlib.suppress(Exception):
                if self.name == "etcd" and not getattr(store, "_closed", False):
                    await store.delete("", prefix=True)
                await store.close()
        if self.actor is not None:
            await self._drop_actor()


@pytest.fixture(params=BACKENDS)
def backend_env(request: pytest.FixtureRequest) -> tuple[str, Any]:
    """Session servers are fetched here, outside any event loop, and only for the backend in use."""
    name: str = request.param
    if name == "etcd":
        return name, request.getfixturevalue("etcd_server")
    if name.startswith("remote"):
        return name, request.getfixturevalue("ray_runtime")
    return name, None


@pytest.fixture
async def backend(backend_env: tuple[str, Any], tmp_path: Path) -> AsyncIterator[Backend]:
    b = Backend(backend_env[0], tmp_path, backend_env[1])
    try:
        yield b
    finally:
        await b.aclose()


@pytest.fixture
async def store(backend: Backend) -> MetadataStore:
    return await backend.open()


async def take(it: AsyncIterator[WatchEvent], n: int, timeout: float = 10.0) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    async with asyncio.timeout(timeout):
        while len(out) < n:
            out.append(await anext(it))
    return out


async def nothing_more(it: AsyncIterator[WatchEvent], within: float = 0.5) -> bool:
    """True if the watch yields nothing within the time (the iterator is finished afterwards)."""
    try:
        await asyncio.wait_for(anext(it), within)
    except TimeoutError:
        return True
    return False


async def eventually(check: Callable[[], Awaitable[T]], timeout: float = 10.0, interval: float = 0.05) -> T:
    """Retry check until it returns something truthy without raising."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = await check()
            if result:
                return result
        except MetadataStoreError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)


def summary(events: list[WatchEvent]) -> list[tuple[str, str, Any, int]]:
    return [(e.type, e.key, e.value, e.mod_revision) for e in events]


# ---------------------------------------------------------------------------------------------- KV


VALUES: list[Any] = [
    0,
    -7,
    2**40,
    1.5,
    "text",
    "ünïcode",
    b"\x00\xffbytes",
    None,
    True,
    [1, "a"],
    {"a": {"b": [1]}},
]


async def test_put_get_delete_round_trip(store: MetadataStore) -> None:
    assert await store.get("k") is None
    rev1 = await store.put("k", {"v": 1})
    kv = await store.get("k")
    assert kv == KeyValue("k", {"v": 1}, create_revision=rev1, mod_revision=rev1, version=1, lease=0)

    rev2 = await store.put("k", {"v": 2})
    assert rev2 == rev1 + 1
    kv = await store.get("k")
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == ({"v": 2}, rev1, rev2, 2)

    assert await store.delete("k") == 1
    assert await store.get("k") is None
    assert await store.delete("k") == 0

    rev3 = await store.put("k", "again")  # re-created: a new life, version restarts
    kv = await store.get("k")
    assert kv is not None and (kv.create_revision, kv.version) == (rev3, 1)

    for i, value in enumerate(VALUES):
        await store.put(f"v/{i}", value)
    assert [kv.value for kv in await store.range("v/")] == [VALUES[i] for i in sorted(range(len(VALUES)), key=str)]


async def test_range_is_by_prefix_in_key_order(store: MetadataStore) -> None:
    for key in ["/a/2", "/a/10", "/a/1", "/ab/1", "/b/1", "/a"]:
        await store.put(key, key)
    assert [kv.key for kv in await store.range("/a/")] == ["/a/1", "/a/10", "/a/2"]
    assert [kv.key for kv in await store.range("/a")] == ["/a", "/a/1", "/a/10", "/a/2", "/ab/1"]
    assert [kv.key for kv in await store.range("/ab/")] == ["/ab/1"]
    assert await store.range("/c/") == []
    assert [kv.key for kv in await store.range("")] == ["/a", "/a/1", "/a/10", "/a/2", "/ab/1", "/b/1"]
    assert all(kv.value == kv.key for kv in await store.range(""))


async def test_delete_prefix(store: MetadataStore) -> None:
    for key in ["/t/1", "/t/2", "/t/3/x", "/tt", "/u"]:
        await store.put(key, 1)
    assert await store.delete("/t/", prefix=True) == 3
    assert [kv.key for kv in await store.range("")] == ["/tt", "/u"]
    assert await store.delete("/t/", prefix=True) == 0

    result = await store.txn([], [Delete("/", prefix=True)])
    assert result.responses == [2]
    assert await store.range("") == []


async def test_revision_increases_by_one_per_mutating_txn(store: MetadataStore) -> None:
    rev0 = await store.revision()
    assert await store.put("a", 1) == rev0 + 1
    result = await store.txn([], [Put("b", 1), Put("c", 1), Delete("a")])
    assert result.succeeded and result.revision == rev0 + 2
    assert await store.revision() == rev0 + 2
    assert {kv.key: kv.mod_revision for kv in await store.range("")} == {"b": rev0 + 2, "c": rev0 + 2}

    # Nothing changed, so no new revision: reads, failed compares without writes, deletes of nothing.
    assert (await store.txn([], [Get("b")])).revision == rev0 + 2
    assert (await store.txn([Compare("b", "version", "==", 9)], [Put("b", 2)])).revision == rev0 + 2
    assert await store.delete("missing") == 0
    assert await store.revision() == rev0 + 2


CAS_CASES = [
    # (target, op, operand, succeeds?) against a key holding "v1" at version 2; MOD and CREATE stand
    # for its mod and create revisions.
    ("value", "==", "v1", True),
    ("value", "==", "other", False),
    ("value", "!=", "other", True),
    ("value", "!=", "v1", False),
    ("version", "==", 2, True),
    ("version", "==", 1, False),
    ("version", ">", 1, True),
    ("version", "<", 2, False),
    ("version", "<", 3, True),
    ("version", "!=", 2, False),
    ("mod_revision", "==", "MOD", True),
    ("mod_revision", "==", "CREATE", False),
    ("mod_revision", ">", "CREATE", True),
    ("mod_revision", "<", "MOD", False),
    ("create_revision", "==", "CREATE", True),
    ("create_revision", "!=", "CREATE", False),
    ("create_revision", "<", "MOD", True),
    ("create_revision", ">", "MOD", False),
]


async def test_txn_compare_targets_and_operators(store: MetadataStore) -> None:
    # One store for all cases (a remote store costs an actor process): each case gets its own key.
    for i, (target, op, operand, ok) in enumerate(CAS_CASES):
        key = f"cas/{i}"
        create = await store.put(key, "v0")
        mod = await store.put(key, "v1")
        if isinstance(operand, str) and operand in ("MOD", "CREATE"):
            operand = mod if operand == "MOD" else create
        case = f"{target} {op} {operand!r}"
        result = await store.txn(
            [Compare(key, target, op, operand)],  # type: ignore[arg-type]
            [Put(key, "won")],
            [Put(f"{key}/lost", True)],
        )
        assert result.succeeded is ok, case
        kv = await store.get(key)
        assert kv is not None and kv.value == ("won" if ok else "v1"), case
        assert (await store.get(f"{key}/lost") is None) is ok, case
        assert result.revision == mod + 1, case  # whichever branch ran wrote once


async def test_txn_compares_on_an_absent_key(store: MetadataStore) -> None:
    for target in ("version", "create_revision", "mod_revision"):
        assert (await store.txn([Compare("absent", target, "==", 0)], [])).succeeded
        assert not (await store.txn([Compare("absent", target, ">", 0)], [])).succeeded
    # As in etcd, a value compare on a missing key is false whatever the operator.
    assert not (await store.txn([Compare("absent", "value", "==", None)], [])).succeeded
    assert not (await store.txn([Compare("absent", "value", "!=", "x")], [])).succeeded

    # "create if absent" succeeds exactly once.
    create_once = [Compare("lock", "version", "==", 0)], [Put("lock", "me")]
    assert (await store.txn(*create_once)).succeeded
    assert not (await store.txn(*create_once)).succeeded


async def test_txn_all_compares_must_hold(store: MetadataStore) -> None:
    await store.put("a", 1)
    await store.put("b", 2)
    both = [Compare("a", "value", "==", 1), Compare("b", "value", "==", 2)]
    one_wrong = [Compare("a", "value", "==", 1), Compare("b", "value", "==", 3)]
    assert (await store.txn(both, [Put("c", 1)])).succeeded
    assert not (await store.txn(one_wrong, [Put("c", 2)])).succeeded
    kv = await store.get("c")
    assert kv is not None and kv.value == 1


async def test_txn_failure_branch_is_applied(store: MetadataStore) -> None:
    await store.put("epoch", 5)
    await store.put("old/1", 1)
    result = await store.txn(
        [Compare("epoch", "value", "==", 4)],
        [Put("epoch", 6)],
        [Put("fenced", True), Delete("old/", prefix=True), Get("epoch")],
    )
    assert not result.succeeded
    assert result.responses[0] is None
    assert result.responses[1] == 1
    assert [kv.value for kv in result.responses[2]] == [5]
    assert await store.get("old/1") is None
    fenced = await store.get("fenced")
    assert fenced is not None and fenced.mod_revision == result.revision


async def test_txn_get_ops_see_earlier_ops_of_the_same_txn(store: MetadataStore) -> None:
    await store.put("p/a", 1)
    result = await store.txn(
        [],
        [Get("p/a"), Put("p/a", 2), Put("p/b", 3), Get("p/a"), Get("p/", prefix=True), Get("nothing")],
    )
    before, _, _, after, listing, nothing = result.responses
    assert [kv.value for kv in before] == [1]
    assert [(kv.value, kv.version, kv.mod_revision) for kv in after] == [(2, 2, result.revision)]
    assert [(kv.key, kv.value) for kv in listing] == [("p/a", 2), ("p/b", 3)]
    assert nothing == []


async def test_txn_rejects_putting_a_key_twice(store: MetadataStore) -> None:
    rev = await store.put("x", 0)
    with pytest.raises(MetadataStoreError):
        await store.txn([], [Put("x", 1), Put("x", 2)])
    with pytest.raises(MetadataStoreError):
        await store.txn([], [Put("x/1", 1), Delete("x/", prefix=True)])
    assert await store.revision() == rev  # nothing of either was applied


async def test_compare_and_swap(store: MetadataStore) -> None:
    assert await store.compare_and_swap("owner", 0, "shard-1")
    assert not await store.compare_and_swap("owner", 0, "shard-2")
    kv = await store.get("owner")
    assert kv is not None
    assert not await store.compare_and_swap("owner", kv.mod_revision - 1, "shard-3")
    assert await store.compare_and_swap("owner", kv.mod_revision, "shard-4")
    kv = await store.get("owner")
    assert kv is not None and kv.value == "shard-4"


async def test_racing_cas_increments_are_not_lost(store: MetadataStore) -> None:
    conflicts = 0

    async def increment() -> None:
        nonlocal conflicts
        while True:
            kv = await store.get("counter")
            current, seen = (kv.value, kv.mod_revision) if kv else (0, 0)
            result = await store.txn([Compare("counter", "mod_revision", "==", seen)], [Put("counter", current + 1)])
            if result.succeeded:
                return
            conflicts += 1

    await asyncio.gather(*(increment() for _ in range(20)))
    kv = await store.get("counter")
    assert kv is not None and (kv.value, kv.version) == (20, 20)


# ---------------------------------------------------------------------------------------------- leases


async def test_lease_keys_vanish_after_ttl(store: MetadataStore) -> None:
    lease = await store.lease_grant(TTL)
    start = time.monotonic()
    rev = await store.put("lease/k", "v", lease=lease)
    await store.put("lease/plain", "stays")
    kv = await store.get("lease/k")
    assert kv is not None and kv.lease == lease

    async with contextlib.aclosing(store.watch("lease/", rev + 2)) as events:
        await eventually(lambda: _absent(store, "lease/k"), timeout=10)
        assert time.monotonic() - start >= TTL * 0.9
        (gone,) = await take(events, 1)
        assert (gone.type, gone.key, gone.value) == ("delete", "lease/k", None)
    assert await store.get("lease/plain") is not None
    assert await store.lease_keepalive(lease) is False


async def _absent(store: MetadataStore, key: str) -> bool:
    return await store.get(key) is None


async def test_lease_keepalive_extends(store: MetadataStore) -> None:
    lease = await store.lease_grant(TTL)
    await store.put("ka/k", 1, lease=lease)
    for _ in range(5):  # 2 s in all: twice the TTL
        await asyncio.sleep(0.4)
        assert await store.lease_keepalive(lease) is True
        assert await store.get("ka/k") is not None
    await eventually(lambda: _absent(store, "ka/k"), timeout=10)
    assert await store.lease_keepalive(lease) is False


async def test_lease_revoke_deletes_at_once(store: MetadataStore) -> None:
    lease = await store.lease_grant(60)
    await store.put("rv/a", 1, lease=lease)
    await store.put("rv/b", 2, lease=lease)
    rev = await store.revision()
    await store.lease_revoke(lease)
    assert await store.range("rv/") == []
    assert await store.revision() == rev + 1  # both keys go in one revision
    await store.lease_revoke(lease)  # revoking what is gone is a no-op
    with pytest.raises(MetadataStoreError):
        await store.put("rv/c", 3, lease=lease)  # the lease no longer exists


async def test_put_without_lease_detaches_key(store: MetadataStore) -> None:
    lease = await store.lease_grant(60)
    await store.put("d/k", 1, lease=lease)
    await store.put("d/k", 2)
    await store.lease_revoke(lease)
    kv = await store.get("d/k")
    assert kv is not None and (kv.value, kv.lease) == (2, 0)


# ---------------------------------------------------------------------------------------------- watch


async def test_watch_delivers_puts_and_deletes_in_order(store: MetadataStore) -> None:
    start = await store.revision() + 1
    async with contextlib.aclosing(store.watch("w/", start)) as events:
        r1 = await store.put("w/a", 1)
        r2 = await store.put("w/b", {"x": 2})
        r3 = (await store.txn([], [Delete("w/a")])).revision
        result = await store.txn([], [Put("w/c", 3), Put("w/a", 4), Delete("w/b")])
        r5 = (await store.txn([], [Delete("w/", prefix=True)])).revision
        got = await take(events, 8)
        assert summary(got) == [
            ("put", "w/a", 1, r1),
            ("put", "w/b", {"x": 2}, r2),
            ("delete", "w/a", None, r3),
            ("put", "w/c", 3, result.revision),  # events of one txn: in the order of its ops
            ("put", "w/a", 4, result.revision),
            ("delete", "w/b", None, result.revision),
            ("delete", "w/a", None, r5),  # a prefix delete: in key order
            ("delete", "w/c", None, r5),
        ]
        assert await nothing_more(events)


async def test_watch_from_now(store: MetadataStore) -> None:
    await store.put("now/old", 0)
    seen: list[WatchEvent] = []

    async def consume() -> None:
        async for event in store.watch("now/"):
            seen.append(event)

    task = asyncio.create_task(consume())
    try:
        # "Now" is fixed when the watch is established, which the caller cannot observe: write markers
        # until one arrives, then everything written afterwards must arrive too.
        await eventually(lambda: _mark(store, seen), timeout=10, interval=0.1)
        rev = await store.put("now/after", 1)
        await eventually(lambda: _arrived(seen, rev))
        assert all(e.key != "now/old" for e in seen)
        assert seen[-1].key == "now/after"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _mark(store: MetadataStore, seen: list[WatchEvent]) -> bool:
    if seen:
        return True
    await store.put("now/marker", time.monotonic())
    return False


async def _arrived(seen: list[WatchEvent], revision: int) -> bool:
    return any(e.mod_revision == revision for e in seen)


async def test_watch_resumes_from_a_revision(store: MetadataStore) -> None:
    revs = [await store.put(f"r/{i}", i) for i in range(5)]
    async with contextlib.aclosing(store.watch("r/", revs[2])) as events:
        assert [e.value for e in await take(events, 3)] == [2, 3, 4]
        rev = await store.put("r/5", 5)
        assert summary(await take(events, 1)) == [("put", "r/5", 5, rev)]


async def test_watch_filters_by_prefix(store: MetadataStore) -> None:
    start = await store.revision() + 1
    async with contextlib.aclosing(store.watch("f/a/", start)) as events:
        await store.put("f/b/1", 1)
        await store.put("f/a/1", 1)
        await store.put("f/a", 1)
        await store.put("f/ab", 1)
        await store.txn([], [Put("f/b/2", 2), Put("f/a/2", 2)])
        await store.delete("f/", prefix=True)
        got = await take(events, 4)
        assert [(e.type, e.key) for e in got] == [
            ("put", "f/a/1"),
            ("put", "f/a/2"),
            ("delete", "f/a/1"),
            ("delete", "f/a/2"),
        ]
        assert await nothing_more(events)


async def test_watch_burst_delivers_every_event_exactly_once(store: MetadataStore) -> None:
    start = await store.revision() + 1
    async with contextlib.aclosing(store.watch("burst/", start)) as events:
        await asyncio.gather(*(store.put(f"burst/{i:03}", i) for i in range(150)))
        for i in range(10):  # multi-event revisions mixed in
            await store.txn([], [Put(f"burst/t{i}/a", i), Put(f"burst/t{i}/b", i), Put("other", i)])
        got = await take(events, 170, timeout=30)
        assert await nothing_more(events)
    revisions = [e.mod_revision for e in got]
    assert revisions == sorted(revisions)
    assert len({(e.key, e.mod_revision) for e in got}) == 170
    assert {e.key for e in got} == {f"burst/{i:03}" for i in range(150)} | {
        f"burst/t{i}/{s}" for i in range(10) for s in "ab"
    }


async def test_watch_stops_when_the_store_is_closed(backend: Backend) -> None:
    store = await backend.open()
    start = await store.revision() + 1
    watch = store.watch("c/", start)
    waiting = asyncio.ensure_future(anext(watch))
    await asyncio.sleep(0.3)
    await store.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, 10)


async def test_watch_compacted_history_raises(backend: Backend, store: MetadataStore) -> None:
    first = await store.put("h/k", 0)
    for i in range(1, 5):
        await store.put("h/k", i)
    last = await store.revision()
    await store.compact(last)
    with pytest.raises(CompactedError):
        await take(store.watch("h/", first), 1)
    # The compaction point itself, and anything later, can still be watched.
    assert [e.value for e in await take(store.watch("h/", last), 1)] == [4]


async def test_compacting_again_or_behind_the_compaction_point_is_not_an_error(store: MetadataStore) -> None:
    for i in range(3):
        await store.put("ca/k", i)
    last = await store.revision()
    await store.compact(last)
    await store.compact(last)  # another compactor got there first
    await store.compact(last - 1)
    assert (await store.get("ca/k")).value == 2  # type: ignore[union-attr]


async def test_status_gives_the_revision_and_the_database_size(store: MetadataStore) -> None:
    await store.put("st/k", "x" * 1000)
    status = await store.status()
    assert status.revision == await store.revision()
    assert status.db_bytes > 1000


async def test_a_mirror_whose_watch_fell_behind_compaction_reads_its_state_again(store: MetadataStore) -> None:
    await store.put("mi/a", 1)
    await store.put("mi/b", 1)
    mirror = Mirror(store, "mi/")
    await mirror.start()
    await mirror.stop()  # its watch is gone, as when the store was out of reach for a while
    behind = await store.revision() + 1
    await store.put("mi/a", 2)
    await store.delete("mi/b")
    await store.put("mi/c", 3)
    await store.compact(await store.revision())  # ... and compaction went past where it stopped
    following = asyncio.get_running_loop().create_task(mirror._follow(behind))
    try:
        await eventually(lambda: _async(mirror.values == {"a": 2, "c": 3}))
        await store.put("mi/d", 4)  # and it follows again from there
        await eventually(lambda: _async(mirror.values.get("d") == 4))
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following


async def _async(value: bool) -> bool:
    return value


async def test_watch_resumes_after_reopen(backend: Backend, store: MetadataStore) -> None:
    """A consumer saves the last revision it handled, restarts, and resumes right after it."""
    async with contextlib.aclosing(store.watch("re/", await store.revision() + 1)) as events:
        await store.put("re/1", 1)
        await store.put("re/2", 2)
        saved = (await take(events, 2))[-1].mod_revision
        await store.put("re/3", 3)  # written before the restart, not yet consumed
    store = await backend.reopen(store)
    await store.put("re/4", 4)
    async with contextlib.aclosing(store.watch("re/", saved + 1)) as events:
        assert [e.value for e in await take(events, 2)] == [3, 4]
        await store.put("re/5", 5)
        assert [e.value for e in await take(events, 1)] == [5]
        assert await nothing_more(events)


async def test_data_and_revisions_survive_reopen(backend: Backend, store: MetadataStore) -> None:
    await store.put("s/a", {"n": 1})
    await store.txn([], [Put("s/b", [2]), Put("s/c", 3)])
    lease = await store.lease_grant(60)
    await store.put("s/leased", 4, lease=lease)
    rev = await store.revision()
    before = await store.range("s/")

    store = await backend.reopen(store)
    assert await store.revision() == rev
    assert await store.range("s/") == before
    assert await store.lease_keepalive(lease) is True
    assert await store.put("s/d", 5) == rev + 1
    await store.lease_revoke(lease)
    assert await store.get("s/leased") is None


# ---------------------------------------------------------------------------------------------- embedded


async def test_embedded_leases_run_their_ttl_again_when_the_store_reopens(tmp_path: Path) -> None:
    """As etcd's do after its restart (test_etcd_leases_run_their_ttl_again_after_a_restart): a holder that could
    not renew because the store was down keeps its keys, and has a TTL to renew them."""
    path = tmp_path / "m.db"
    store = EmbeddedStore(path)
    renewed = await store.lease_grant(TTL)
    abandoned = await store.lease_grant(TTL)
    await store.put("l/renewed", 1, lease=renewed)
    await store.put("l/abandoned", 2, lease=abandoned)
    rev = await store.revision()
    await store.close()
    await asyncio.sleep(TTL * 1.5)  # both ran out while nobody could reach the store

    store = EmbeddedStore(path)
    try:
        assert await store.revision() == rev  # nothing expired on open
        assert [kv.key for kv in await store.range("l/")] == ["l/abandoned", "l/renewed"]

        async def abandoned_gone() -> bool:  # the holder of `renewed` is back and renews
            assert await store.lease_keepalive(renewed) is True
            return await _absent(store, "l/abandoned")

        # Not renewed: gone a TTL after the reopen, with its delete event.
        await eventually(abandoned_gone, timeout=5, interval=TTL / 4)
        assert [kv.key for kv in await store.range("l/")] == ["l/renewed"]
        events = await take(store.watch("l/", rev + 1), 1)
        assert summary(events) == [("delete", "l/abandoned", None, rev + 1)]
    finally:
        await store.close()


async def test_embedded_history_is_bounded(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "m.db", history_revisions=5, memory_revisions=2)
    try:
        for i in range(20):
            await store.put("k", i)
        with pytest.raises(CompactedError):
            await take(store.watch("", 15), 1)
        # The last five revisions are kept; the first three of them come from disk, not memory.
        assert [e.value for e in await take(store.watch("", 16), 5)] == [15, 16, 17, 18, 19]
    finally:
        await store.close()
    store = EmbeddedStore(tmp_path / "m.db", history_revisions=5)
    try:
        with pytest.raises(CompactedError):
            await take(store.watch("", 15), 1)
        assert [e.value for e in await take(store.watch("", 16), 5)] == [15, 16, 17, 18, 19]
    finally:
        await store.close()


async def test_embedded_store_refuses_a_second_open(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "m.db")
    try:
        with pytest.raises(MetadataStoreError):
            EmbeddedStore(tmp_path / "m.db")
    finally:
        await store.close()
    await EmbeddedStore(tmp_path / "m.db").close()  # free again once the first one is closed


async def test_embedded_concurrent_writers_share_commits(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "m.db")
    try:
        revs = await asyncio.gather(*(store.put(f"g/{i}", i) for i in range(500)))
        assert sorted(revs) == list(range(1, 501))
        assert len(await store.range("g/")) == 500
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------------- etcd


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of the test's own, for tests that restart it."""
    with EtcdServer(tmp_path / "etcd") as server:
        yield server


@pytest.mark.etcd
async def test_etcd_leases_run_their_ttl_again_after_a_restart(private_etcd: EtcdServer) -> None:
    """The reference for the embedded store: etcd extends every lease when a member becomes leader, so an
    outage longer than a lease's TTL does not expire it."""
    store = EtcdStore(private_etcd.endpoint, prefix="/promote/", timeout=2.0)
    try:
        lease = await store.lease_grant(TTL)
        await store.put("p/k", 1, lease=lease)
        private_etcd.stop()
        await asyncio.sleep(TTL * 2.5)
        private_etcd.start()
        await eventually(store.revision)
        assert await store.get("p/k") is not None
        await eventually(lambda: _absent(store, "p/k"), timeout=10)  # not renewed: it lapses after all
    finally:
        await store.close()


@pytest.mark.etcd
async def test_etcd_watch_survives_server_restart(private_etcd: EtcdServer) -> None:
    store = EtcdStore(private_etcd.endpoint, prefix="/restart/", timeout=2.0)
    idle = store.watch("w/", 1)  # suspended between events while etcd goes away
    active: list[WatchEvent] = []

    async def consume() -> None:
        async for event in store.watch("w/", 1):
            active.append(event)

    consumer = asyncio.create_task(consume())
    try:
        await store.put("w/1", 1)
        await store.put("w/2", 2)
        assert [e.value for e in await take(idle, 2)] == [1, 2]
        await eventually(lambda: _count(active, 2))

        # Down: writes fail (no silent queueing), the active watcher starts retrying.
        private_etcd.stop()
        with pytest.raises(MetadataStoreError):
            await store.put("w/never", 0)
        await asyncio.sleep(0.7)
        private_etcd.start()
        await eventually(store.revision)  # reads retry; once one works, so do writes
        # Written after the disconnect and before the watchers are back: delivered once, in order.
        await store.put("w/3", 3)
        await store.put("w/4", 4)

        private_etcd.restart()  # and once more with the idle watcher still parked
        await eventually(store.revision)
        await store.put("w/5", 5)

        assert [e.value for e in await take(idle, 3)] == [3, 4, 5]
        await eventually(lambda: _count(active, 5))
        await store.put("w/6", 6)
        await eventually(lambda: _count(active, 6))
        assert [e.value for e in active] == [1, 2, 3, 4, 5, 6]
        assert [e.value for e in await take(idle, 1)] == [6]
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        await idle.aclose()
        await store.close()


async def _count(events: list[WatchEvent], n: int) -> bool:
    assert len(events) <= n, f"more events than written: {summary(events)}"
    return len(events) == n


@pytest.mark.etcd
async def test_etcd_prefixes_are_isolated(etcd_server: EtcdServer) -> None:
    one = EtcdStore(etcd_server.endpoint, prefix="/iso-one/")
    two = EtcdStore([etcd_server.endpoint], prefix="/iso-one-two/")  # one's prefix is a prefix of it
    try:
        await one.put("k", 1)
        await two.put("k", 2)
        assert [(kv.key, kv.value) for kv in await one.range("")] == [("k", 1)]
        assert [(kv.key, kv.value) for kv in await two.range("")] == [("k", 2)]
        assert await one.delete("", prefix=True) == 1
        assert await two.get("k") is not None
    finally:
        await two.delete("", prefix=True)
        await one.close()
        await two.close()


async def test_etcd_unreachable_raises_metadata_store_error() -> None:
    store = EtcdStore(f"127.0.0.1:{free_port()}", timeout=0.5)
    try:
        with pytest.raises(MetadataStoreError):
            await store.get("k")
        with pytest.raises(MetadataStoreError):
            await store.put("k", 1)
    finally:
        await store.close()


@pytest.mark.etcd
async def test_etcd_store_fixture_is_namespaced(etcd_store: EtcdStore) -> None:
    await etcd_store.put("x", 1)
    assert etcd_store.prefix.startswith("/test-")
    assert [kv.key for kv in await etcd_store.range("")] == ["x"]


# ---------------------------------------------------------------------------------------------- remote


async def test_remote_wait_events_returns_whole_revisions(ray_runtime: Any, tmp_path: Path) -> None:
    from kafscale.actors.metadata_actor import MetadataStoreActor

    actor = MetadataStoreActor.remote(data_dir=str(tmp_path))
    try:
        for i in range(3):
            await actor.txn.remote([], [Put(f"x/{i}/a", i), Put(f"x/{i}/b", i)])
        # Asked for at most 3 events, it returns 4: never half of a revision.
        batch = await actor.wait_events.remote("x/", 0, 1.0, 3)
        assert [(e.key, e.mod_revision) for e in batch] == [
            ("x/0/a", 1),
            ("x/0/b", 1),
            ("x/1/a", 2),
            ("x/1/b", 2),
        ]
        assert await actor.wait_events.remote("x/", 3, 0.2) == []
        with pytest.raises(CompactedError):
            await actor.compact.remote(3)
            await actor.wait_events.remote("x/", 0, 1.0)
    finally:
        await actor.close.remote()
        ray_runtime.kill(actor)


async def test_remote_store_travels_to_other_processes(ray_runtime: Any, tmp_path: Path) -> None:
    from kafscale.actors.metadata_actor import MetadataStoreActor, RemoteMetadataStore

    actor = MetadataStoreActor.remote(data_dir=str(tmp_path))
    try:
        store = RemoteMetadataStore(actor)
        assert isinstance(pickle.loads(pickle.dumps(store)), RemoteMetadataStore)

        @ray_runtime.remote(num_cpus=0)
        def write_from_a_worker(remote: RemoteMetadataStore) -> int:
            return asyncio.run(remote.put("from-worker", "hello"))

        rev = await write_from_a_worker.remote(store)
        kv = await store.get("from-worker")
        assert kv is not None and (kv.value, kv.mod_revision) == ("hello", rev)
    finally:
        await actor.close.remote()
        ray_runtime.kill(actor)


# ---------------------------------------------------------------------------------------------- settings


async def test_metadata_store_from_settings(tmp_path: Path) -> None:
    embedded = metadata_store_from_settings(data_dir=str(tmp_path), etcd_endpoints=None)
    assert isinstance(embedded, EmbeddedStore) and embedded.path == tmp_path / "metadata.db"
    await embedded.close()
    etcd = metadata_store_from_settings(data_dir=str(tmp_path), etcd_endpoints="127.0.0.1:2379,127.0.0.1:2380")
    assert isinstance(etcd, EtcdStore)
    assert etcd.endpoints == ["127.0.0.1:2379", "127.0.0.1:2380"] and etcd.prefix == "/kafscale/"
    await etcd.close()
    with pytest.raises(ValueError):
        metadata_store_from_settings(data_dir=None, etcd_endpoints=None)


async def test_metadata_store_from_settings_reaches_an_embedded_store_elsewhere(tmp_path: Path) -> None:
    """A shard passes how to reach the one embedded store (the metadata actor); etcd still wins."""
    hosted = EmbeddedStore(tmp_path / "metadata.db")
    try:
        assert metadata_store_from_settings(data_dir=None, etcd_endpoints=None, embedded=lambda: hosted) is hosted
        etcd = metadata_store_from_settings(data_dir=None, etcd_endpoints="127.0.0.1:2379", prefix="/p/",
                                            embedded=lambda: hosted)
        assert isinstance(etcd, EtcdStore) and etcd.prefix == "/p/"
        await etcd.close()
    finally:
        await hosted.close()
