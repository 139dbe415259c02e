"""Fetch sessions (KIP-227): a consumer that fetches the same partitions again and again names them once.

A full fetch (session epoch 0) may open a session: the answer carries its id, and the shard keeps the session's
partitions with their fetch offsets, and what it last told of each (high watermark, log start). The client's
next fetches are incremental (epoch 1, 2, ...): they name only the partitions whose fetch position changed, plus
the ones to forget, and the answer holds only the partitions with something new (records, a moved high watermark
or log start, an error). Epoch -1 ends the session, or asks for none.

One cache per shard (a shard is one broker to its clients), bounded as Kafka bounds it: at most
`max_incremental_fetch_session_cache_slots` sessions. When it is full, a new session takes the place of one unused
for two minutes, or of a smaller one at least two minutes old; otherwise the fetch is answered without one.

Pure state and no I/O: the Fetch handler (kafscale/acceptor/handlers/fetch.py) opens a plan before it fetches and
settles it with the results.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from kafscale.broker.results import FetchResult

NO_SESSION = 0
INITIAL_EPOCH = 0  # a full fetch that may open a session
FINAL_EPOCH = -1  # a full fetch that ends the session it names and opens none
EVICTION_MS = 120_000  # Kafka's fixed min.incremental.fetch.session.eviction.ms

SessionKey = tuple[Hashable, int]  # (topic name, or topic id from Fetch v13 on; partition)


def next_epoch(epoch: int) -> int:
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == 0x7FFFFFFF else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """A partition of a session: what the client asked for last, and what it was last told."""

    name: str | None  # the topic's name (None: a topic id no topic has)
    fetch_offset: int
    max_bytes: int
    high_watermark: int = -1
    log_start_offset: int = -1

    def must_answer(self, result: FetchResult) -> bool:
        """Whether an incremental answer includes the partition; what it includes is remembered. An error sets the
        remembered high watermark to -1, so that the partition is told again once the error is gone."""
        changed = bool(result.records) or result.error != ErrorCode.none
        if result.high_watermark != self.high_watermark or result.log_start_offset != self.log_start_offset:
            changed = True
        self.high_watermark = -1 if result.error != ErrorCode.none else result.high_watermark
        self.log_start_offset = result.log_start_offset
        return changed


@dataclass(slots=True)
class FetchSession:
    id: int
    uses_ids: bool  # opened by Fetch v13+, whose topics are ids: its fetches must stay v13+ (and v12- ones v12-)
    partitions: dict[SessionKey, CachedPartition]  # in fetch order: those answered with records go last
    epoch: int
    created: float
    last_used: float


@dataclass(slots=True)
class FetchPlan:
    """One fetch request's view of the cache: an error for the whole request, or the partitions to fetch."""

    error: int = 0
    partitions: dict[SessionKey, CachedPartition] = field(default_factory=dict)
    session: FetchSession | None = None  # an incremental fetch's session
    opens: bool = False  # a full fetch that asks for a session
    epoch: int = 0  # the request's


@dataclass(slots=True)
class FetchAnswer:
    error: int
    session_id: int
    keys: list[SessionKey]  # the partitions to answer, in order


class FetchSessionCache:
    def __init__(self, slots: int, eviction_ms: int = EVICTION_MS, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.slots = slots
        self.eviction_s = eviction_ms / 1000
        self._clock = clock
        self._rng = rng or random.Random()
        self._sessions: dict[int, FetchSession] = {}
        self.evictions = 0
        self.incremental = 0  # incremental fetches planned (a client that uses sessions makes these)

    def __len__(self) -> int:
        return len(self._sessions)

    def partitions_cached(self) -> int:
        return sum(len(s.partitions) for s in self._sessions.values())

    def plan(self, session_id: int, epoch: int, requested: dict[SessionKey, CachedPartition],
             forgotten: list[SessionKey], uses_ids: bool) -> FetchPlan:
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            self._sessions.pop(session_id, None)  # a full fetch ends the session it names
            return FetchPlan(partitions=requested, opens=epoch == INITIAL_EPOCH and self.slots > 0, epoch=epoch)
        session = self._sessions.get(session_id)
        if session is None:
            return FetchPlan(error=int(ErrorCode.fetch_session_id_not_found), epoch=epoch)
        if session.epoch != epoch:
            return FetchPlan(error=int(ErrorCode.invalid_fetch_session_epoch), epoch=epoch)
        if session.uses_ids != uses_ids:
            return FetchPlan(error=int(ErrorCode.fetch_session_topic_id_error), epoch=epoch)
        for key, wanted in requested.items():
            cached = session.partitions.get(key)
            if cached is None:
                session.partitions[key] = wanted
            else:
                cached.fetch_offset, cached.max_bytes = wanted.fetch_offset, wanted.max_bytes
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:  # nothing left to fetch: the session ends, the answer is a plain one
            del self._sessions[session.id]
            return FetchPlan(partitions=requested, epoch=epoch)
        session.last_used = self._clock()
        session.epoch = next_epoch(session.epoch)
        self.incremental += 1
        return FetchPlan(partitions=dict(session.partitions), session=session, epoch=epoch)

    def answer(self, plan: FetchPlan, results: dict[SessionKey, FetchResult], uses_ids: bool) -> FetchAnswer:
        if plan.error:
            return FetchAnswer(plan.error, NO_SESSION, [])
        session = plan.session
        if session is None:
            opened = self._open(plan.partitions, results, uses_ids) if plan.opens else NO_SESSION
            return FetchAnswer(0, opened, list(plan.partitions))
        if session.epoch != next_epoch(plan.epoch):  # another fetch of this session came in meanwhile
            return FetchAnswer(int(ErrorCode.invalid_fetch_session_epoch), session.id, [])
        keys = [key for key, result in results.items()
                if key in session.partitions and session.partitions[key].must_answer(result)]
        for key in keys:
            if results[key].records:  # round robin: a partition that got records is fetched last next time
                session.partitions[key] = session.partitions.pop(key)
        return FetchAnswer(0, session.id, keys)

    def _open(self, partitions: dict[SessionKey, CachedPartition], results: dict[SessionKey, FetchResult],
              uses_ids: bool) -> int:
        now = self._clock()
        if len(self._sessions) >= self.slots and not self._evict(len(partitions), now):
            return NO_SESSION
        for key, cached in partitions.items():
            result = results.get(key)
            if result is not None:
                cached.high_watermark = -1 if result.error else result.high_watermark
                cached.log_start_offset = result.log_start_offset
        session_id = NO_SESSION
        while session_id == NO_SESSION or session_id in self._sessions:
            session_id = self._rng.randint(1, 0x7FFFFFFE)
        self._sessions[session_id] = FetchSession(session_id, uses_ids, partitions, next_epoch(INITIAL_EPOCH),
                                                  now, now)
        return session_id

    def _evict(self, size: int, now: float) -> bool:
        """Make room for a session of `size` partitions: the least recently used session if it is stale, else the
        smallest of those at least `eviction_ms` old if it is smaller than the new one."""
        oldest = min(self._sessions.values(), key=lambda s: (s.last_used, s.id))
        victim: FetchSession | None = oldest if now - oldest.last_used > self.eviction_s else None
        if victim is None:
            settled = [s for s in self._sessions.values() if now - s.created > self.eviction_s]
            smallest = min(settled, key=lambda s: (len(s.partitions), s.id), default=None)
            if smallest is not None and size > len(smallest.partitions):
                victim = smallest
        if victim is None:
            return False
        del self._sessions[victim.id]
        self.evictions += 1
        return True
