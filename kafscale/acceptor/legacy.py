"""The old protocol versions, where they differ from the current ones only in what they carry: Produce v0-v2
(legacy message sets, converted to v2 batches on the way in), Fetch v0-v3 (v2 batches converted back to messages
on the way out) and ListOffsets v0 (a list of offsets instead of one). The conversions themselves are
kafscale/storage/legacy_convert.py; here they meet the topic's configs and Kafka's request-level rules. Only old
versions call into this module: the handlers' current paths do not touch it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kio.schema.errors import ErrorCode

from kafscale.broker.interface import Broker, FetchItem
from kafscale.broker.results import FetchResult, ProduceResult
from kafscale.storage.batch import CORRUPT_MESSAGE, InvalidBatchError, batch_size
from kafscale.storage.legacy_convert import UnsupportedCodec, down_convert, fit, up_convert

__all__ = ["fetch_results", "list_offsets_v0", "produce_records"]

log = logging.getLogger(__name__)

LATEST, EARLIEST = -1, -2


def _configs(broker: Broker, topic: str, partition: int) -> tuple[bool, dict[str, object]]:
    """(whether the partition exists as this shard sees topics, the topic's configs)."""
    info = broker.topics.topics.get(topic)
    if info is None:
        return False, {}
    return 0 <= partition < info.partitions, info.configs


# ------------------------------------------------------------------------------------------------ Produce v0-v2


def produce_records(broker: Broker, topic: str, partition: int, records: bytearray) -> bytearray | ProduceResult:
    """One partition's message set as the v2 batch its owner appends, or the answer when there is nothing to
    append: Kafka's error for the set, or success with base offset -1 for a set without a whole message."""
    exists, configs = _configs(broker, topic, partition)
    max_bytes = configs.get("max.message.bytes")
    try:
        converted = up_convert(records, log_append_time=configs.get("message.timestamp.type") == "LogAppendTime",
                               max_message_bytes=None if max_bytes is None else int(str(max_bytes)))
    except InvalidBatchError as e:
        # Kafka looks up the partition before it reads the records.
        if not exists:
            return ProduceResult(int(ErrorCode.unknown_topic_or_partition))
        return ProduceResult(e.error_code, message=e.reason)
    except Exception as e:  # a client's bytes never break the connection: whatever else they hold is damage
        log.warning("legacy message set for %s-%d could not be converted: %r", topic, partition, e)
        if not exists:
            return ProduceResult(int(ErrorCode.unknown_topic_or_partition))
        return ProduceResult(CORRUPT_MESSAGE, message=f"message set cannot be read: {e}")
    if not converted:
        return ProduceResult(int(ErrorCode.none if exists else ErrorCode.unknown_topic_or_partition))
    return bytearray(converted)


# ------------------------------------------------------------------------------------------------ Fetch v0-v3


def fetch_results(broker: Broker, version: int, parts: list[FetchItem], results: list[FetchResult],
                  max_bytes: int) -> list[FetchResult]:
    """The broker's v2 answers, in request order, as Kafka answers Fetch v0-v3: magic 0 messages for v0-v1 and
    magic 1 for v2-v3, each partition's records sized as Kafka sizes a down-converted fetch (legacy_convert.fit).

    Which batches Kafka would have read: v0-v2 have a hard limit per partition, so a first batch larger than
    partition_max_bytes yields nothing (the consumer sees an empty set and must fetch more bytes); v3 shares
    max_bytes across the partitions in order and lets only the first partition with data exceed it. Errors carry
    high watermark -1, as Kafka's do."""
    magic = 0 if version <= 1 else 1
    budget = max_bytes if version >= 3 else 0x7FFFFFFF
    first_may_exceed = version >= 3
    out = []
    for (topic, partition, offset, limit), r in zip(parts, results, strict=True):
        _, configs = _configs(broker, topic, partition)
        if configs.get("compression.type") == "zstd":  # Kafka refuses every fetch below v10 of such a topic
            out.append(FetchResult(int(ErrorCode.unsupported_compression_type), -1, -1))
            continue
        if r.error:
            out.append(FetchResult(r.error, -1, -1))
            continue
        take = _whole_batches(r.records, min(limit, budget), first_may_exceed)
        if take:
            first_may_exceed = False
            budget = max(0, budget - take)
        try:
            chunks, _ = down_convert(memoryview(r.records)[:take], magic, offset)
        except UnsupportedCodec:
            out.append(FetchResult(int(ErrorCode.unsupported_compression_type), -1, -1))
            continue
        out.append(FetchResult(0, r.high_watermark, r.log_start_offset, fit(chunks, take)))
    return out


def _whole_batches(records: bytes, limit: int, may_exceed: bool) -> int:
    """Bytes of the leading whole batches within limit (the first one even beyond it, when may_exceed)."""
    at = 0
    while at < len(records):
        size = batch_size(records, at)
        if at + size > limit and not (at == 0 and may_exceed):
            break
        at += size
    return at


# ------------------------------------------------------------------------------------------------ ListOffsets v0


async def list_offsets_v0(broker: Broker, topic: str, partition: int, timestamp: int,
                          max_num_offsets: int) -> tuple[int, list[int]]:
    """(error, offsets) as Kafka's legacyFetchOffsetsBefore answers, its segments being Kafscale's partition as
    one: [(log start, last modified), (high watermark, now) when the partition holds records]. The newest entry at
    or before `timestamp` and those before it, newest first, at most max_num_offsets of them; -1 (latest) starts at
    the last entry, -2 (earliest) at the first. "Last modified" is the partition's largest record timestamp (the
    time of its last append for LogAppendTime topics), or the topic's creation while it has none."""
    if timestamp < 0 and timestamp not in (LATEST, EARLIEST):
        return int(ErrorCode.unsupported_version), []  # -3 and the like came with ListOffsets v7+
    if max_num_offsets < 0:
        return int(ErrorCode.invalid_request), []
    latest, earliest = await asyncio.gather(broker.list_offset(topic, partition, LATEST),
                                            broker.list_offset(topic, partition, EARLIEST))
    for r in (latest, earliest):
        if r.error:
            return r.error, []
    entries = [earliest.offset] + ([latest.offset] if latest.offset > earliest.offset else [])
    if timestamp == LATEST:
        start = len(entries) - 1
    elif timestamp == EARLIEST:
        start = 0
    else:
        now = int(time.time() * 1000)
        if len(entries) == 2 and timestamp >= now:
            start = 1
        else:
            start = 0 if timestamp >= await _last_modified(broker, topic, partition, len(entries) == 2, now) else -1
    return 0, entries[start::-1][:max_num_offsets] if start >= 0 else []


async def _last_modified(broker: Broker, topic: str, partition: int, has_records: bool, now: int) -> int:
    if has_records:
        newest = await broker.list_offset(topic, partition, -3)
        return newest.timestamp if newest.error == 0 and newest.timestamp >= 0 else now
    info = broker.topics.topics.get(topic)
    return info.created_ms if info is not None else now
