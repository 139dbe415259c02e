"""What DescribeLogDirs reports of a shard: one log directory, the object store's location, holding the
partitions this shard leads, each with its size.

Kafka's brokers answer for the replicas on their disks; a Kafscale shard answers for the partitions it leads
(every partition has exactly one), so asking every broker of the cluster covers each partition once, as tools
such as kafka-log-dirs expect. A partition led here but not opened yet is opened to be measured, as a Kafka
broker has every log it hosts open. One that cannot be opened (the stores are down) is left out and the log
directory reports KAFKA_STORAGE_ERROR, Kafka's answer for a directory it cannot read.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafscale.broker.shard import Shard

log = logging.getLogger(__name__)

OPENS_AT_ONCE = 16  # partitions opened at a time to be measured: a shard may lead thousands


@dataclass(frozen=True, slots=True)
class PartitionSize:
    topic: str
    partition: int
    size: int


@dataclass(frozen=True, slots=True)
class LogDir:
    path: str
    partitions: tuple[PartitionSize, ...]
    readable: bool  # False: some partition could not be opened, and is missing from `partitions`
    total_bytes: int  # of the volume holding it: a local directory's file system; -1 for S3, which has no bound
    usable_bytes: int


Wanted = dict[str, set[int] | None]  # topic -> its partitions asked for (None: all of the topic's)


async def describe(shard: Shard, wanted: Wanted | None) -> LogDir:
    """The shard's log directory, with the partitions it leads among `wanted` (None: all of them)."""
    led = [(name, p) for name, info in sorted(shard.topics.topics.items()) if wanted is None or name in wanted
           for p in range(info.partitions) if _asked(wanted, name, p) and shard.leads(name, p)]
    gate = asyncio.Semaphore(OPENS_AT_ONCE)

    async def measure(topic: str, partition: int) -> PartitionSize | None:
        async with gate:
            try:
                return PartitionSize(topic, partition, (await shard.owner(topic, partition)).size)
            except Exception as e:
                log.warning("DescribeLogDirs: cannot open %s-%d to measure it: %s", topic, partition, e)
                return None

    sizes = await asyncio.gather(*(measure(t, p) for t, p in led))
    found = tuple(s for s in sizes if s is not None)
    volume = shard.objects.volume(shard.config.s3_namespace)
    return LogDir(volume.path, found, len(found) == len(sizes), volume.total_bytes, volume.usable_bytes)


def _asked(wanted: Wanted | None, topic: str, partition: int) -> bool:
    if wanted is None:
        return True
    partitions = wanted[topic]
    return partitions is None or partition in partitions
