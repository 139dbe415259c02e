"""Fetch sessions (KIP-227): the cache alone, and the Fetch handler over the fake broker (no socket)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

from kafscale.acceptor.handlers import fetch
from kafscale.broker.fetch_sessions import CachedPartition, FetchSessionCache
from kafscale.broker.results import FetchResult
from kafscale.protocol.codec import encode_response, make, request_class
from kafscale.protocol.errors import ErrorCode
from tests.unit.fake_broker import FakeBroker, context, fake_broker, record_batch


def fetch_request(version: int, session_id: int, epoch: int, topic: Any, offsets: dict[int, int],
                  forgotten: tuple[int, ...] = ()) -> Any:
    mod = sys.modules[request_class(1, version).__module__]
    key = "topic_id" if version >= 13 else "topic"
    parts = tuple(make(mod.FetchPartition, partition=p, current_leader_epoch=-1, fetch_offset=o, last_fetched_epoch=-1,
                       log_start_offset=-1, partition_max_bytes=1 << 20) for p, o in offsets.items())
    return make(request_class(1, version), replica_id=-1, max_wait=0, min_bytes=0, max_bytes=1 << 20,
                isolation_level=0, session_id=session_id, session_epoch=epoch, rack_id="",
                topics=(make(mod.FetchTopic, **{key: topic}, partitions=parts),) if parts else (),
                forgotten_topics_data=(make(mod.ForgottenTopic, **{key: topic}, partitions=forgotten),)
                if forgotten else ())


async def ask(broker: FakeBroker, version: int, *args: Any, **kwargs: Any) -> Any:
    answer = await fetch.handle(broker, context(1, version), fetch_request(version, *args, **kwargs))
    encode_response(7, answer)  # every answer encodes
    return answer


def answered(response: Any) -> dict[int, tuple[int, int, int]]:
    """partition -> (error, high watermark, record bytes)"""
    return {p.partition_index: (int(p.error_code), p.high_watermark, len(p.records or b""))
            for t in response.responses for p in t.partitions}


async def test_a_full_fetch_opens_a_session_and_incremental_fetches_answer_only_what_changed(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        info = await broker.topics.create("t", 3, [0, 0, 0])
        for p in range(3):
            await broker.produce("t", p, record_batch(b"a"), -1, 1000)
        full = await ask(broker, 17, 0, 0, info.id, {0: 0, 1: 0, 2: 0})
        assert full.error_code == ErrorCode.none and full.session_id > 0
        assert {p: (e, hw) for p, (e, hw, _) in answered(full).items()} == {0: (0, 1), 1: (0, 1), 2: (0, 1)}
        session = full.session_id

        # The client read everything: it names the new fetch offsets; nothing changed, nothing is answered.
        quiet = await ask(broker, 17, session, 1, info.id, {0: 1, 1: 1, 2: 1})
        assert (quiet.error_code, quiet.session_id, answered(quiet)) == (ErrorCode.none, session, {})
        # Records in partition 1 only: the next fetch names no partition and gets partition 1 alone.
        await broker.produce("t", 1, record_batch(b"b", b"c"), -1, 1000)
        news = await ask(broker, 17, session, 2, info.id, {})
        assert {p: hw for p, (_, hw, _) in answered(news).items()} == {1: 3}
        assert answered(news)[1][2] > 0
        # Partition 2 forgotten, partition 1 read to its end: only partition 0's new record is news.
        await broker.produce("t", 0, record_batch(b"d"), -1, 1000)
        await broker.produce("t", 2, record_batch(b"e"), -1, 1000)
        after = await ask(broker, 17, session, 3, info.id, {1: 3}, forgotten=(2,))
        assert set(answered(after)) == {0}
        assert len(broker.fetch_sessions) == 1 and broker.fetch_sessions.partitions_cached() == 2


async def test_session_errors_are_kafkas_and_epoch_minus_one_ends_a_session(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        info = await broker.topics.create("t", 1, [0])
        session = (await ask(broker, 17, 0, 0, info.id, {0: 0})).session_id
        for sid, epoch, code in ((session, 5, ErrorCode.invalid_fetch_session_epoch),
                                 (session + 1, 1, ErrorCode.fetch_session_id_not_found),
                                 (0, 3, ErrorCode.fetch_session_id_not_found)):
            refused = await ask(broker, 17, sid, epoch, info.id, {0: 0})
            assert (refused.error_code, refused.session_id, refused.responses) == (code, 0, ())
        # A session opened with topic ids (v13+) cannot go on at v12, whose topics are names.
        by_name = await ask(broker, 12, session, 1, "t", {0: 0})
        assert by_name.error_code == ErrorCode.fetch_session_topic_id_error
        ok = await ask(broker, 13, session, 1, info.id, {})
        assert ok.error_code == ErrorCode.none and ok.session_id == session
        # A full fetch at epoch -1 closes the session it names and opens none.
        closing = await ask(broker, 17, session, -1, info.id, {0: 0})
        assert (closing.error_code, closing.session_id, set(answered(closing))) == (ErrorCode.none, 0, {0})
        gone = await ask(broker, 17, session, 2, info.id, {})
        assert gone.error_code == ErrorCode.fetch_session_id_not_found
        # Before v7 there are no sessions at all.
        old = await fetch.handle(broker, context(1, 6), fetch_request(6, 0, 0, "t", {0: 0}))
        assert set(answered(old)) == {0} and len(broker.fetch_sessions) == 0


async def test_an_error_is_told_every_time_and_the_partition_again_once_it_is_gone(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        session = (await ask(broker, 12, 0, 0, "t", {0: 0})).session_id
        for epoch in (1, 2):  # out of range: answered each time
            assert answered(await ask(broker, 12, session, epoch, "t", {0: 7} if epoch == 1 else {})) == {
                0: (int(ErrorCode.offset_out_of_range), -1, 0)}
        back = await ask(broker, 12, session, 3, "t", {0: 0})  # the client resets; told again though nothing changed
        assert answered(back) == {0: (0, 0, 0)}
        assert answered(await ask(broker, 12, session, 4, "t", {})) == {}
        unknown = uuid.uuid4()
        ids = (await ask(broker, 17, 0, 0, unknown, {0: 0})).session_id
        assert answered(await ask(broker, 17, ids, 1, unknown, {})) == {0: (int(ErrorCode.unknown_topic_id), -1, 0)}


def cached(n: int) -> dict[Any, CachedPartition]:
    return {("t", p): CachedPartition("t", 0, 1024) for p in range(n)}


def test_the_cache_is_bounded_and_evicts_as_kafka_does() -> None:
    now = [0.0]
    cache = FetchSessionCache(2, eviction_ms=120_000, clock=lambda: now[0])

    def open_session(n: int) -> int:
        plan = cache.plan(0, 0, cached(n), [], False)
        return cache.answer(plan, {k: FetchResult(0, 0, 0) for k in plan.partitions}, False).session_id

    small, big = open_session(1), open_session(3)
    assert small and big and len(cache) == 2
    assert open_session(5) == 0, "a full cache of fresh sessions takes no new one"
    now[0] = 121.0  # both are two minutes old now, but used at time 0: the least recently used is stale
    cache.plan(big, 1, {}, [], False)  # big is used again
    third = open_session(1)
    assert third and len(cache) == 2
    assert cache.plan(small, 1, {}, [], False).error == ErrorCode.fetch_session_id_not_found
    now[0] = 200.0  # no session is stale; big (3 partitions, old enough) only gives way to a bigger one
    assert open_session(2) == 0
    assert open_session(4) and cache.plan(big, 2, {}, [], False).error == ErrorCode.fetch_session_id_not_found
    assert cache.evictions == 2
    assert FetchSessionCache(0).plan(0, 0, cached(1), [], False).opens is False  # 0 slots: no sessions


def test_a_partition_that_got_records_is_fetched_last_next_time() -> None:
    cache = FetchSessionCache(10)
    plan = cache.plan(0, 0, cached(3), [], False)
    session = cache.answer(plan, {k: FetchResult(0, 5, 0) for k in plan.partitions}, False).session_id
    plan = cache.plan(session, 1, {}, [], False)
    results = {k: FetchResult(0, 5, 0, records=b"x" if k == ("t", 0) else b"") for k in plan.partitions}
    assert cache.answer(plan, results, False).keys == [("t", 0)]
    assert list(cache.plan(session, 2, {}, [], False).partitions) == [("t", 1), ("t", 2), ("t", 0)]
