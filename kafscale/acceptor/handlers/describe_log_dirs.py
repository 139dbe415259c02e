"""DescribeLogDirs v0-v4: one log directory per shard (kafscale.broker.log_dirs), holding the partitions it leads
with their sizes; DESCRIBE on the cluster, else nothing (v3+: CLUSTER_AUTHORIZATION_FAILED), as Kafka answers.
Topics or partitions this shard does not lead are left out, as a Kafka broker leaves out replicas it does not
host."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed_on_cluster, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.broker.log_dirs import Wanted
from kafscale.security.acl import Operation

API_KEY, MIN_VERSION, MAX_VERSION = 35, 0, 4


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    if not allowed_on_cluster(broker, ctx, Operation.DESCRIBE):
        return make(mod.DescribeLogDirsResponse, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.cluster_authorization_failed, results=())
    wanted: Wanted | None = None if req.topics is None else {
        t.topic: {int(p) for p in t.partitions} for t in req.topics}
    found = await broker.log_dir(wanted)
    topics: dict[str, list[Any]] = {}
    for p in found.partitions:
        topics.setdefault(p.topic, []).append(make(mod.DescribeLogDirsPartition, partition_index=p.partition,
                                                   partition_size=p.size, offset_lag=0, is_future_key=False))
    result = make(mod.DescribeLogDirsResult,
                  error_code=ErrorCode.none if found.readable else ErrorCode.kafka_storage_error,
                  log_dir=found.path, total_bytes=found.total_bytes, usable_bytes=found.usable_bytes,
                  topics=tuple(make(mod.DescribeLogDirsTopic, name=name, partitions=tuple(parts))
                               for name, parts in topics.items()))
    return make(mod.DescribeLogDirsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                results=(result,))
