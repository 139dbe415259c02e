"""The partition owner: single writer of one partition (offsets, buffer, flush, fencing).

Write path: append() checks the batches, applies the idempotent-producer rules, assigns offsets and buffers
the batches in the open flush window. The flush (kafscale.broker.flush) turns each window into one segment,
uploads it with conditional creates and commits the partition state with a compare on the owner key's
revision (fencing); only then do the high watermark advance and acks=all producers get their answers.
The owner holds all of the partition's state; the flush works on it. Reads of committed data go through
`ReadPath`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.broker.append_checks import AppendOutcome, refusal
from kafscale.broker.commit_batcher import CommitBatcher
from kafscale.broker.flush import FencedError, Pending, flush_loop
from kafscale.broker.packer import Packer
from kafscale.broker.producer_state import BatchMeta, ProducerEntry, ProducerStates
from kafscale.broker.read_path import ReadPath
from kafscale.broker.stats import PartitionSink
from kafscale.broker.txn_state import PartitionTxns
from kafscale.cluster import keys
from kafscale.cluster.records import SegmentMeta
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.batch import (
    BatchHeader,
    InvalidBatchError,
    set_base_offset,
    set_log_append_time,
    split_batches,
)
from kafscale.storage.cache import ByteLRU
from kafscale.storage.control import TxnMarker
from kafscale.storage.health import HealthState
from kafscale.storage.metadata_store import MAX_TXN_OPS, Compare, Delete, MetadataStore, Put
from kafscale.storage.recompress import recompress_batches
from kafscale.storage.segment import SEGMENT_FOOTER_SIZE, SEGMENT_HEADER_SIZE

log = logging.getLogger(__name__)

_SEGMENT_OVERHEAD = SEGMENT_HEADER_SIZE + SEGMENT_FOOTER_SIZE


@dataclass(frozen=True, slots=True)
class OwnerSettings:
    namespace: str = "default"
    segment_bytes: int = 4 * 1024 * 1024
    flush_interval_ms: int = 50
    blocked_flush_min_bytes: int = 0
    index_interval_bytes: int = 4096
    max_pending_bytes: int = 64 * 1024 * 1024
    readahead_segments: int = 1
    uploads_in_flight: int = 4


class PartitionOwner:
    def __init__(
        self,
        topic: str,
        partition: int,
        *,
        shard_id: int,
        meta: MetadataStore,
        objects: AsyncObjectStore,
        cache: ByteLRU,
        settings: OwnerSettings,
        topic_config: Callable[[], dict[str, Any]] = dict,
        metrics: PartitionSink | None = None,
        committer: CommitBatcher | None = None,
        packer: Packer | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.shard_id = shard_id
        self.meta = meta
        self.objects = objects
        self.settings = settings
        self.topic_config = topic_config
        self.metrics = metrics
        self.committer = committer  # shares flush commits with the shard's other owners; None: own transactions
        # its segments go up in packs: a virtual partition's physical partition's, or its plain topic's on this shard
        self.packer = packer
        self.epoch = 0
        self.next_offset = 0  # next offset to assign (buffered included)
        self.high_watermark = 0  # end of committed data
        self.log_start_offset = 0
        self.fenced = False
        self.closed = False
        # Record batch bytes taken in and served, since open: the shard's load figures (kafscale.ops.load_meter)
        self.bytes_in = 0
        self.bytes_out = 0
        self.segments: list[SegmentMeta] = []
        self.reader = ReadPath(self, cache)
        self.owner_revision = 0
        self._producers = ProducerStates()
        self.txns = PartitionTxns()
        self._open = Pending()
        self._sealed: deque[Pending] = deque()
        self._sealed_bytes = 0  # sum of their nbytes: the buffer check runs on every append
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._data_waiters: set[asyncio.Event] = set()
        self._flusher: asyncio.Task[None] | None = None
        # Flush commits, log start moves (retention, DeleteRecords) and cleanings' swaps all edit the committed log.
        self.state_lock = asyncio.Lock()
        self.cleaning = False  # a cleaning pass is writing objects the janitor must not judge yet

    # ---------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        """Take ownership (bumping the epoch) and rebuild state from the metadata store.

        Objects a previous owner uploaded but never committed are not in the segment list, so they
        are never served; the first flush at their offset replaces them.
        """
        owner_key = keys.owner(self.topic, self.partition)
        for _ in range(20):
            current = await self.meta.get(owner_key)
            epoch = (current.value["epoch"] + 1) if current else 1
            seen = current.mod_revision if current else 0
            result = await self.meta.txn(
                [Compare(owner_key, "mod_revision", "==", seen)],
                [Put(owner_key, {"epoch": epoch, "shard": self.shard_id})],
            )
            if result.succeeded:
                self.epoch = epoch
                self.owner_revision = result.revision
                break
        else:
            raise FencedError(f"could not take ownership of {self.topic}-{self.partition}: contended")
        # Read after the epoch is ours (no earlier owner can commit any more), all three at once: the
        # first produce to a partition waits for this open, one metadata round trip instead of three.
        state, segments, producers = await asyncio.gather(
            self.meta.get(keys.state(self.topic, self.partition)),
            self.meta.range(keys.segments(self.topic, self.partition)),
            self.meta.range(keys.producers(self.topic, self.partition)),
        )
        if state is not None:
            self.high_watermark = self.next_offset = int(state.value["next_offset"])
            self.log_start_offset = int(state.value.get("log_start_offset", 0))
        self.segments = sorted(
            (SegmentMeta.from_value(kv.value) for kv in segments if kv.value["base"] < self.high_watermark),
            key=lambda s: s.base,
        )
        for kv in producers:
            pid = int(kv.key.rsplit("/", 1)[1])
            entry = self._producers.entries[pid] = ProducerEntry.from_value(kv.value)
            if 0 <= entry.txn_first < self.high_watermark:  # its transaction is still open here
                self.txns.began(pid, entry.txn_first)
        for segment in self.segments:
            for aborted in segment.aborted:
                self.txns.add_aborted(aborted)
        self._flusher = asyncio.get_running_loop().create_task(flush_loop(self))
        log.info("owner %s-%d open: epoch %d, offsets [%d, %d), %d segments", self.topic, self.partition,
                 self.epoch, self.log_start_offset, self.high_watermark, len(self.segments))

    async def close(self, flush: bool = True) -> None:
        """Flush what is buffered (unless fenced) and stop the flush loop; flush=False stops it at once."""
        if self.closed:
            return
        self.closed = True
        if flush and not self.fenced:
            self._seal()
        self._wake.set()
        if self._flusher is not None:
            if not flush:
                self._flusher.cancel()
            done, _ = await asyncio.wait({self._flusher}, timeout=30)
            if not done:
                self._flusher.cancel()
        self._cancel_uploads()
        self._fail_all(ErrorCode.not_leader_or_follower)
        self._notify_readers()

    # ---------------------------------------------------------------- write path

    def pending_bytes(self) -> int:
        return self._open.nbytes + self._sealed_bytes

    async def append(self, records: bytes | bytearray, *, acks: int, deadline: float | None = None) -> AppendOutcome:
        """Assign offsets to the batches in `records` and buffer them for the next flush.
        deadline (event loop time): give up waiting for buffer space then, with REQUEST_TIMED_OUT."""
        while (outcome := self.try_append(records, acks=acks)) is None:
            # Back-pressure: hold the producer while too much is waiting for the object store.
            self._space.clear()
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                return AppendOutcome(ErrorCode.request_timed_out, message="buffer full: the object store is behind")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._space.wait(), timeout=remaining)
        return outcome

    def try_append(self, records: bytes | bytearray, *, acks: int) -> AppendOutcome | None:
        """append() without waiting: None, with nothing changed, while the buffer is full.
        A bytearray is taken over and patched in place (the caller must not reuse it)."""
        if self.fenced or self.closed:
            return AppendOutcome(ErrorCode.not_leader_or_follower)
        if self.objects.state() != HealthState.HEALTHY:
            return AppendOutcome(ErrorCode.kafka_storage_error, message="object store is not healthy")
        if self.pending_bytes() > self.settings.max_pending_bytes:
            return None
        buf = records if isinstance(records, bytearray) else bytearray(records)
        try:
            batches = split_batches(buf, verify_crc=True)
        except InvalidBatchError as e:
            return AppendOutcome(ErrorCode(e.error_code), message=e.reason)
        if not batches:
            return AppendOutcome(ErrorCode.invalid_record, message="no record batches")
        configs = self.topic_config()
        error = refusal(f"{self.topic}-{self.partition}", buf, batches, configs)
        if error is not None:
            return error
        codec = configs.get("compression.type", "producer")
        if codec != "producer":
            buf, batches = recompress_batches(buf, batches, codec)

        duplicate = self._find_duplicate(batches)
        if duplicate is not None:
            return duplicate
        refused = self._producers.check_request([h for _, h in batches])
        if refused is not None:
            return AppendOutcome(refused, log_start_offset=self.log_start_offset)

        log_append = configs.get("message.timestamp.type") == "LogAppendTime"
        now_ms = int(time.time() * 1000)
        base = self.next_offset
        segment_bytes = int(configs.get("segment.bytes", self.settings.segment_bytes))
        # Roll before the append that would overflow, as Kafka does: a segment stays within
        # segment.bytes unless a single request alone is larger.
        if self._open.chunks and _SEGMENT_OVERHEAD + self._open.nbytes + len(buf) > segment_bytes:
            self._seal()
        pending = self._open
        if not pending.chunks:
            pending.first_offset = base
            pending.started = time.monotonic()
        for pos, header in batches:
            set_base_offset(buf, pos, self.next_offset)
            if log_append:
                set_log_append_time(buf, pos, now_ms)
            if header.producer_id >= 0:
                entry = self._producers.record(header, self.next_offset)
                if log_append:  # the batch's max timestamp is the append time now, as Kafka records it
                    entry.last_timestamp = now_ms
                if header.is_transactional and entry.txn_first < 0:
                    entry.txn_first = self.next_offset
                    self.txns.began(header.producer_id, self.next_offset)
                pending.producers[header.producer_id] = entry.copy()
            else:
                pending.plain = True
            self.next_offset += header.last_offset_delta + 1
        pending.chunks.append(buf)
        self.bytes_in += len(buf)
        pending.nbytes += len(buf)
        pending.last_offset = self.next_offset - 1
        outcome = AppendOutcome(base_offset=base, log_append_time=now_ms if log_append else -1,
                                log_start_offset=self.log_start_offset)
        if acks != 0:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            pending.waiters.append(fut)
            outcome.durable = fut
        if _SEGMENT_OVERHEAD + pending.nbytes >= segment_bytes:
            self._seal()
        self._wake.set()
        return outcome

    def append_marker(self, marker: TxnMarker) -> AppendOutcome:
        """A transaction coordinator's marker: ends the producer's transaction here once committed (its
        outcome's `durable`). Taken even when the buffer is full: a marker is tiny, and it is what lets
        read_committed consumers move on."""
        if self.fenced or self.closed:
            return AppendOutcome(ErrorCode.not_leader_or_follower)
        if self.objects.state() != HealthState.HEALTHY:
            return AppendOutcome(ErrorCode.kafka_storage_error, message="object store is not healthy")
        refused = self._producers.check_marker(marker.producer_id, marker.producer_epoch)
        if refused is not None:
            return AppendOutcome(refused, message="marker from an older producer epoch")
        now_ms = int(time.time() * 1000)
        buf = marker.batch(now_ms)
        if self._open.chunks and _SEGMENT_OVERHEAD + self._open.nbytes + len(buf) > self._segment_bytes():
            self._seal()
        pending = self._open
        offset = self.next_offset
        if not pending.chunks:
            pending.first_offset = offset
            pending.started = time.monotonic()
        set_base_offset(buf, 0, offset)
        pending.producers[marker.producer_id] = self._producers.end_txn(
            marker.producer_id, marker.producer_epoch, marker.coordinator_epoch, now_ms).copy()
        aborted = self.txns.ended(marker.producer_id, offset, marker.commit)
        if aborted is not None:
            pending.aborted.append(aborted)
        self.next_offset += 1
        pending.chunks.append(buf)
        pending.nbytes += len(buf)
        pending.last_offset = offset
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending.waiters.append(fut)
        # EndTxn waits for this marker, and its producer already waited a flush for its last records: seal the
        # window at the flush loop's next turn instead of at the end of its interval.
        pending.started = min(pending.started, time.monotonic() - self.settings.flush_interval_ms / 1000)
        self._wake.set()
        return AppendOutcome(base_offset=offset, log_start_offset=self.log_start_offset, durable=fut)

    @property
    def size(self) -> int:
        """Bytes of the log as Kafka counts a partition's size: its segments from the log start on, and what waits
        to be flushed (Kafka's active segment holds that)."""
        return sum(s.size for s in self.segments if s.last >= self.log_start_offset) + self._open.nbytes \
            + self._sealed_bytes

    @property
    def producers(self) -> ProducerStates:
        """The idempotent and transactional producers' state (DescribeProducers reads it; only appends change it)."""
        return self._producers

    def producer_epoch(self, producer_id: int) -> int:
        entry = self._producers.entries.get(producer_id)
        return entry.epoch if entry is not None else -1

    def _segment_bytes(self) -> int:
        return int(self.topic_config().get("segment.bytes", self.settings.segment_bytes))

    @property
    def last_stable_offset(self) -> int:
        """read_committed consumers read up to here: the first offset of the oldest open transaction, or the
        high watermark; never below the log start (retention or DeleteRecords may drop a transaction's first
        records while it is still open, and a consumer reset to the end must land inside the log)."""
        if not self.txns.open and not self.txns.has_ending:
            return self.high_watermark
        return max(self.log_start_offset, self.txns.last_stable_offset(self.high_watermark))

    def _find_duplicate(self, batches: list[tuple[int, BatchHeader]]) -> AppendOutcome | None:
        """A retried idempotent request: answer with the offsets its batches got the first time."""
        metas: list[BatchMeta] = []
        for _, header in batches:
            if header.producer_id < 0:
                return None
            verdict = self._producers.check(header)
            if not isinstance(verdict, BatchMeta):
                return None
            metas.append(verdict)
        outcome = AppendOutcome(base_offset=metas[0].base_offset, log_start_offset=self.log_start_offset)
        last = metas[-1].last_offset
        if last >= self.high_watermark:
            # Still buffered: the retry is durable exactly when the original is.
            outcome.durable = self._durable_future_for(last)
        return outcome

    def _durable_future_for(self, offset: int) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for pending in [*self._sealed, self._open]:
            if pending.chunks and pending.first_offset <= offset <= pending.last_offset:
                pending.waiters.append(fut)
                return fut
        fut.set_result(None)
        return fut

    def flush_now(self, producer_id: int) -> None:
        """The producer can send nothing more until it is answered (kafscale.acceptor.blocked_producers): if its
        records are in the open window, seal it without waiting for the flush interval. (If they are sealed
        already, the open window holds only others' records, which keep their interval.) A plain producer's (-1)
        records carry no id: any plain records in the window count as its."""
        if self.packer is not None and not self.packer.ticks:  # a virtual partition's segment waits for its
            return  # pack's window anyway
        if self._open.chunks and not self._open.due_now and (
                producer_id in self._open.producers if producer_id >= 0 else self._open.plain):
            self._open.due_now = True
            self._wake.set()

    def _seal(self) -> None:
        if self._open.chunks:
            self._sealed.append(self._open)
            self._sealed_bytes += self._open.nbytes
            self._open = Pending()

    async def advance_log_start(self, offset: int) -> list[SegmentMeta]:
        """Move the log start offset up to `offset` (<= high watermark) durably, dropping the segments
        wholly below it from the committed state; returns them (the caller deletes their objects)."""
        async with self.state_lock:
            if offset <= self.log_start_offset or self.fenced:
                return []
            dropped = [s for s in self.segments if s.last < offset]
            guard = [Compare(keys.owner(self.topic, self.partition), "mod_revision", "==", self.owner_revision)]
            # etcd takes at most 128 operations a transaction: a long-idle retention pass can drop thousands of
            # small segments, so the log start moves in steps, each durable and each a prefix of the log.
            step = MAX_TXN_OPS - len(guard) - 1
            for i in range(0, max(len(dropped), 1), step):
                chunk = dropped[i:i + step]
                to = offset if i + step >= len(dropped) else chunk[-1].last + 1
                state = {"next_offset": self.high_watermark, "log_start_offset": to, "epoch": self.epoch}
                ops: list[Any] = [Put(keys.state(self.topic, self.partition), state)]
                ops += [Delete(keys.segment(self.topic, self.partition, s.base)) for s in chunk]
                if not (await self.meta.txn(guard, ops)).succeeded:
                    self.stop_writing()
                    raise FencedError(f"log start move of {self.topic}-{self.partition} refused: epoch is stale")
                self.log_start_offset = to
                self.segments = [s for s in self.segments if s.last >= to]
                self.txns.drop_below(to)
        return dropped

    async def expire_producers(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget idle producers (ProducerStates.idle) durably, except those with batches not yet committed here;
        returns their ids. A producer seen again later starts afresh, as in Kafka. The state lock is taken per
        store transaction, so that a long backlog never holds the partition's commits back for long."""
        gone: list[int] = []
        while not self.fenced:
            async with self.state_lock:
                idle = [pid for pid in self._producers.idle(now_ms, expiration_ms) if pid not in self._in_flight()]
                if not idle:
                    break
                chunk = idle[: MAX_TXN_OPS - 1]
                guard = [Compare(keys.owner(self.topic, self.partition), "mod_revision", "==", self.owner_revision)]
                ops: list[Any] = [Delete(keys.producer(self.topic, self.partition, pid)) for pid in chunk]
                if not (await self.meta.txn(guard, ops)).succeeded:
                    self.stop_writing()
                    raise FencedError(f"producer expiry of {self.topic}-{self.partition} refused: epoch is stale")
                # Appended to meanwhile: its next commit writes the entry again, so it stays.
                still = set(self._producers.idle(now_ms, expiration_ms)) - self._in_flight()
                for pid in chunk:
                    if pid in still:
                        del self._producers.entries[pid]
                        gone.append(pid)
                if len(chunk) == len(idle):
                    break
        return gone

    def _in_flight(self) -> set[int]:
        """Producers with batches in windows not yet committed."""
        return {pid for p in (*self._sealed, self._open) for pid in p.producers}

    def stop_writing(self) -> None:
        """This incarnation writes no more; its unanswered producers retry against the next owner."""
        self.fenced = True
        self._cancel_uploads()
        self._fail_all(ErrorCode.not_leader_or_follower)

    def _cancel_uploads(self) -> None:
        for pending in self._sealed:
            if pending.upload is None:
                continue
            if not pending.upload.done():
                pending.upload.cancel()
            elif not pending.upload.cancelled():
                pending.upload.exception()  # an upload that gave up will never be committed: nothing to report

    def _fail_all(self, code: ErrorCode) -> None:
        for pending in [*self._sealed, self._open]:
            for fut in pending.waiters:
                if not fut.done():
                    fut.set_exception(PartitionError(code))
                    fut.exception()  # acks=1 producers never await theirs: no "never retrieved" noise
        self._space.set()

    # ---------------------------------------------------------------- read side

    def add_data_waiter(self, event: asyncio.Event) -> None:
        self._data_waiters.add(event)

    def remove_data_waiter(self, event: asyncio.Event) -> None:
        self._data_waiters.discard(event)

    def _notify_readers(self) -> None:
        for event in self._data_waiters:
            event.set()

    def segment_for(self, offset: int) -> SegmentMeta | None:
        """The committed segment holding `offset`, or the next one after a gap."""
        i = bisect.bisect_right(self.segments, offset, key=lambda s: s.base) - 1
        if i >= 0 and self.segments[i].last >= offset:
            return self.segments[i]
        return self.segments[i + 1] if i + 1 < len(self.segments) else None


class PartitionError(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code
