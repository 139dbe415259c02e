"""What the broker answers, per partition: plain dataclasses that pass through Ray unchanged when a call is
forwarded to the owning shard. `error` is a Kafka error code (0: none)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kafscale.groups.offsets import OffsetEntry


@dataclass(slots=True)
class ProduceResult:
    error: int
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()  # (index of the record in its batch, why), Produce v8+


@dataclass(slots=True)
class FetchResult:
    error: int
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    last_stable_offset: int = -1  # -1: the high watermark (no transaction open)
    # read_committed: (producer id, first offset) of every aborted transaction the records overlap
    aborted: list[tuple[int, int]] | None = None


@dataclass(slots=True)
class OffsetResult:
    """ListOffsets: the offset (and the record's timestamp, for a lookup by time) of one partition."""

    error: int
    offset: int = -1
    timestamp: int = -1


@dataclass(slots=True)
class DeleteRecordsResult:
    error: int
    low_watermark: int = -1


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition a group committed to: its committed offset, the high watermark, and the lag (None when
    the high watermark could not be read)."""

    topic: str
    partition: int
    committed: int
    high_watermark: int
    lag: int | None


@dataclass(slots=True)
class GroupOffsets:
    """A group's committed offsets, of topics that exist now (OffsetFetch)."""

    error: int
    offsets: dict[tuple[str, int], OffsetEntry] = field(default_factory=dict)
