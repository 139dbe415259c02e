"""A shard's side of partitions changing hands in planned moves (ShardCore.release and ShardCore.route).

While a partition is released (flushed and let go, placement not yet naming the successor), requests for it
wait here instead of being refused: a refusal would send the client into its retry back-off, which is
longer than a hand-off. They are then forwarded to the successor. A hand-off the controller never finished
lapses after HANDOFF_HOLD_S, and the partition is served here again.

Once it has moved, requests still sent here are refused with NOT_LEADER_OR_FOLLOWER for MOVED_AWAY_S, so
clients refresh their metadata and go to the new leader instead of being forwarded for good.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

HANDOFF_HOLD_S = 10.0  # how long a released partition waits for placement to name its successor
MOVED_AWAY_S = 60.0  # how long a shard refuses, instead of forwarding, requests for a partition it gave away

Key = tuple[str, int]


class HandOffs:
    def __init__(self) -> None:
        self.released: dict[Key, tuple[float, asyncio.Event]] = {}  # since when, and set when it moved
        self.moved_away: dict[Key, float] = {}

    def holds(self, key: Key) -> bool:
        """Released here and not yet moved: this shard must not serve it."""
        return bool(self.released) and key in self.released

    def release(self, key: Key) -> None:
        self.released[key] = (asyncio.get_running_loop().time(), asyncio.Event())

    def moved(self, key: Key) -> None:
        """Placement no longer names this shard for the partition."""
        self.moved_away[key] = asyncio.get_running_loop().time()
        self.settled(key)

    def settled(self, key: Key) -> None:
        """Placement was written (the partition moved, or stayed): waiting requests go on."""
        entry = self.released.pop(key, None)
        if entry is not None:
            entry[1].set()

    def moved_lately(self, key: Key) -> bool:
        if not self.moved_away:
            return False
        since = self.moved_away.get(key)
        if since is not None and asyncio.get_running_loop().time() - since > MOVED_AWAY_S:
            del self.moved_away[key]  # clients have refreshed by now: forward as for any other shard
            return False
        return since is not None

    async def wait(self, key: Key, deadline: float | None) -> None:
        """Until placement names the successor, the deadline (event loop time) passes, or the hold lapses."""
        loop = asyncio.get_running_loop()
        since, moved = self.released[key]
        remaining = since + HANDOFF_HOLD_S - loop.time()
        if deadline is not None:
            remaining = min(remaining, deadline - loop.time())
        try:
            await asyncio.wait_for(moved.wait(), max(remaining, 0))
        except TimeoutError:
            current = self.released.get(key)
            if loop.time() - since >= HANDOFF_HOLD_S and current is not None and current[1] is moved:
                log.warning("hand-off of %s-%d was not completed: serving it again", *key)
                self.settled(key)
