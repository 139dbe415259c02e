"""What a partition owner checks of a producer's batches before it takes any of them, as Kafka's LogValidator does:
one bad batch (or record) refuses the whole request for the partition, with Kafka's error code and message."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.cluster import topic_configs
from kafscale.compaction.records import decoded, keyless
from kafscale.storage.batch import BatchHeader, InvalidBatchError, client_batch_problem

_AFTER_DEFAULT = int(topic_configs.DEFAULTS["message.timestamp.after.max.ms"])
_BEFORE_DEFAULT = int(topic_configs.DEFAULTS["message.timestamp.before.max.ms"])


@dataclass(slots=True)
class AppendOutcome:
    error: ErrorCode = ErrorCode.none
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    message: str | None = None
    durable: asyncio.Future[None] | None = None  # resolves when the records are committed
    record_errors: tuple[tuple[int, str], ...] = ()  # (record's index in its batch, why): INVALID_RECORD's detail


def refusal(partition: str, buf: bytearray, batches: list[tuple[int, BatchHeader]],
            configs: dict[str, Any]) -> AppendOutcome | None:
    """Why the batches in `buf` (of `partition`, "topic-p") are refused, or None."""
    for _, h in batches:
        problem = client_batch_problem(h)
        if problem is not None:
            return AppendOutcome(ErrorCode.invalid_record, message=problem)
        if h.is_control:  # only a transaction coordinator writes markers
            return AppendOutcome(ErrorCode.invalid_record, message="control batches come from the broker only")
        if h.is_transactional and h.producer_id < 0:
            return AppendOutcome(ErrorCode.invalid_record, message="a transactional batch needs a producer id")
    compacted = "compact" in topic_configs.policies(configs)
    keyless = _keyless(partition, buf, batches) if compacted else None
    # Kafka answers INVALID_TIMESTAMP when any record has a bad timestamp, naming the keyless records too.
    if configs.get("message.timestamp.type", "CreateTime") == "CreateTime":
        refused = _out_of_time(buf, batches, configs)
        if refused is not None:
            if keyless is not None and refused.error == ErrorCode.invalid_timestamp:
                refused.record_errors = tuple(sorted(refused.record_errors + keyless.record_errors))
            return refused
    if keyless is not None:
        return keyless
    # A topic that does not set it has Kafka's default (message.max.bytes), which bounds batches just the same.
    max_bytes = int(configs.get("max.message.bytes", topic_configs.DEFAULTS["max.message.bytes"]))
    for _, h in batches:
        if h.size > max_bytes:
            return AppendOutcome(ErrorCode.message_too_large,
                                 message=f"batch of {h.size} bytes exceeds max.message.bytes")
    return None


def _out_of_time(buf: bytearray, batches: list[tuple[int, BatchHeader]],
                 configs: dict[str, Any]) -> AppendOutcome | None:
    """A CreateTime record stamped beyond message.timestamp.after.max.ms ahead of the broker's clock, or
    message.timestamp.before.max.ms behind it: INVALID_TIMESTAMP naming each, as Kafka's LogValidator answers.
    A batch's maxTimestamp decides whether its records are read at all (the later bound is the one set by
    default); the earlier bound, when a topic sets one, reads every record."""
    after = int(configs.get("message.timestamp.after.max.ms", _AFTER_DEFAULT))
    before = int(configs.get("message.timestamp.before.max.ms", _BEFORE_DEFAULT))
    now = int(time.time() * 1000)
    low, high = max(now - before, -(2**63)), min(now + after, 2**63 - 1)
    for pos, h in batches:
        if h.max_timestamp <= high and before == _BEFORE_DEFAULT:
            continue
        try:
            stamps = [r.timestamp for r in decoded(buf[pos : pos + h.size], h)]
        except InvalidBatchError as e:  # records that do not parse
            return AppendOutcome(ErrorCode(e.error_code), message=e.reason)
        errors = [(j, f"Timestamp {ts} of message with offset {j} is out of range. The timestamp should be within "
                      f"[{low}, {high}]") for j, ts in enumerate(stamps) if ts != -1 and not low <= ts <= high]
        if errors:  # worded as Kafka words it
            return AppendOutcome(ErrorCode.invalid_timestamp, record_errors=tuple(errors),
                                 message="One or more records have been rejected due to invalid timestamp")
    return None


def _keyless(partition: str, buf: bytearray, batches: list[tuple[int, BatchHeader]]) -> AppendOutcome | None:
    """A compacted topic takes no record without a key: INVALID_RECORD naming each (Produce v8+'s record errors),
    worded as Kafka words it."""
    why = f"Compacted topic cannot accept message without key in topic partition {partition}"
    try:
        errors = tuple((i, why) for pos, h in batches for i in keyless(buf[pos : pos + h.size], h))
    except InvalidBatchError as e:  # records that do not parse
        return AppendOutcome(ErrorCode(e.error_code), message=e.reason)
    if not errors:
        return None
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
    return AppendOutcome(ErrorCode.invalid_record, record_errors=errors,
                         message=f"One or more records have been rejected due to {len(errors)} record errors in "
                                 f"total, and only showing the first three errors at most: [{shown}]")
