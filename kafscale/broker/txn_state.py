"""The transactions of one partition: which are open, where its last stable offset is, which were aborted.

A transactional producer's first batch in a partition opens its transaction there; the coordinator's marker
(kafscale.storage.control) ends it. The last stable offset (LSO) is the first offset of the oldest transaction
not yet ended by a committed marker, or the high watermark: read_committed consumers read up to it. Every aborted
transaction's range [first offset, marker offset] is kept (in memory here, durably in the record of the segment
that holds its marker) so that read_committed fetches can list the aborted ranges they overlap, as Kafka's
transaction index does. Only the partition owner's task touches this.
"""

from __future__ import annotations

import bisect

from kafscale.cluster.records import AbortedTxn


class PartitionTxns:
    def __init__(self) -> None:
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self._ending: list[tuple[int, int]] = []  # (marker offset, first offset) of markers not yet committed
        self.aborted: list[AbortedTxn] = []  # committed aborts, in marker order
        self._aborted_last: list[int] = []  # their last offsets, for bisect

    def began(self, producer_id: int, offset: int) -> None:
        self.open.setdefault(producer_id, offset)

    def ended(self, producer_id: int, marker_offset: int, commit: bool) -> AbortedTxn | None:
        """A marker was appended at marker_offset. The aborted range it closes (to record with its segment), if
        it aborts a transaction open here; a marker for no open transaction (a coordinator's retry) ends nothing."""
        first = self.open.pop(producer_id, None)
        if first is None:
            return None
        self._ending.append((marker_offset, first))
        return None if commit else AbortedTxn(producer_id, first, marker_offset)

    def committed(self, high_watermark: int, aborted: list[AbortedTxn]) -> None:
        """Segments up to high_watermark were committed, holding the markers of `aborted`."""
        self._ending = [e for e in self._ending if e[0] >= high_watermark]
        for a in aborted:
            self.add_aborted(a)

    def add_aborted(self, a: AbortedTxn) -> None:
        self.aborted.append(a)
        self._aborted_last.append(a.last_offset)

    def replace_aborted(self, aborted: list[AbortedTxn]) -> None:
        """The index after a cleaning removed the markers (and so the entries) of transactions it no longer needs."""
        self.aborted = sorted(aborted, key=lambda a: a.last_offset)
        self._aborted_last = [a.last_offset for a in self.aborted]

    @property
    def has_ending(self) -> bool:
        return bool(self._ending)

    def last_stable_offset(self, high_watermark: int) -> int:
        lso = high_watermark
        for first in self.open.values():
            lso = min(lso, first)
        for marker, first in self._ending:
            if marker >= high_watermark:
                lso = min(lso, first)
        return lso

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions a read of offsets [start, end] overlaps."""
        i = bisect.bisect_left(self._aborted_last, start)
        return [a for a in self.aborted[i:] if a.first_offset <= end]

    def drop_below(self, log_start: int) -> None:
        """Retention moved the log start: aborted ranges wholly before it are of no use any more."""
        i = bisect.bisect_left(self._aborted_last, log_start)
        if i:
            del self.aborted[:i]
            del self._aborted_last[:i]
