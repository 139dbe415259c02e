"""Writing a transaction coordinator's marker into one partition (Kafka's WriteTxnMarkers, one partition a call).

The marker goes to the partition's owner, here or on the shard that leads it, and the answer comes once it is
committed: the coordinator moves a transaction to Complete only after every marker is durable. Errors are
Kafka codes; the coordinator retries the retriable ones (the owner may be moving or opening).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from kafscale.broker.partition_owner import PartitionError
from kafscale.broker.routing import Refused, Remote
from kafscale.storage.control import TxnMarker

if TYPE_CHECKING:
    from kafscale.broker.shard import ShardCore

log = logging.getLogger(__name__)


async def write(core: ShardCore, topic: str, partition: int, marker: TxnMarker, timeout_ms: int) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(timeout_ms, 1) / 1000
    where = await core.route(topic, partition, deadline)
    if isinstance(where, Refused):
        return int(where.error)
    if isinstance(where, Remote):
        try:
            return await where.peer.write_txn_marker(topic, partition, marker,
                                                     max(int((deadline - loop.time()) * 1000), 1))
        except Exception as e:  # the shard is going away: the coordinator retries
            log.warning("marker for %s-%d not written on shard %d: %s", topic, partition, where.shard, e)
            return int(ErrorCode.not_leader_or_follower)
    outcome = where.owner.append_marker(marker)
    if outcome.error != ErrorCode.none or outcome.durable is None:
        return int(outcome.error)
    try:
        await asyncio.wait_for(asyncio.shield(outcome.durable), timeout=max(deadline - loop.time(), 0.001))
    except TimeoutError:
        return int(ErrorCode.request_timed_out)
    except PartitionError as e:
        return int(e.code)
    return int(ErrorCode.none)
