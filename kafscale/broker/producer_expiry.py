"""Producer-id expiry: a producer's state in a partition (its last sequences, its epoch) is forgotten once its last
batch is producer.id.expiration.ms old and it has no transaction open there, as Kafka forgets it. Without it the
metadata store would keep one entry per partition for every producer that ever wrote: every restart of an
idempotent application is a new producer id."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafscale.broker.partition_owner import PartitionOwner

log = logging.getLogger(__name__)


async def run(owners: Callable[[], Iterable[PartitionOwner]], interval_s: float, expiration_ms: int) -> None:
    """One loop per shard, over every owner it hosts."""
    while True:
        await asyncio.sleep(interval_s)
        now_ms = int(time.time() * 1000)
        for owner in list(owners()):
            if owner.closed or owner.fenced:
                continue
            try:
                gone = await owner.expire_producers(now_ms, expiration_ms)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # store trouble, or the owner was fenced: the next round tries again
                log.warning("producer expiry of %s-%d failed: %s", owner.topic, owner.partition, e)
                continue
            if gone:
                log.info("%s-%d: %d idle producer(s) forgotten", owner.topic, owner.partition, len(gone))
