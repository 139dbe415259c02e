"""OffsetFetch v0-v9: committed offsets (-1 where nothing is committed), every committed partition when no
topics are named (v2+), several groups in one request (v8); v9 names the member asking, and a member of a
consumer-protocol group (KIP-848) must ask at its current epoch (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID).

require_stable (v7+, KIP-447; a read_committed consumer asks it): a partition with offsets in an open
transaction (TxnOffsetCommit, kafscale/groups/txn_offsets.py) answers UNSTABLE_OFFSET_COMMIT and offset -1, as
Kafka does, and the consumer asks again until the transaction ends. Such a request is answered only by the
group's coordinator (NOT_COORDINATOR elsewhere, as Kafka): only it knows the open transactions.

v0 reads the same offsets as v1: Kafscale has one offset store (ZooKeeper-era Kafka read v0 from ZooKeeper, and
Kafka 3.9 in KRaft mode answers v0 with UNSUPPORTED_VERSION in every partition; docs/compatibility.md)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.groups.consumer.group import ConsumerGroup
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 9, 0, 9

# (topic, [(partition, offset, leader epoch, metadata, error)])
Topics = list[tuple[str, list[tuple[int, int, int, str, ErrorCode]]]]


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    stable = bool(getattr(req, "require_stable", False))  # v7+
    if ctx.api_version >= 8:
        groups = []
        for g in req.groups:
            error = await _check_member(broker, g.group_id, getattr(g, "member_id", None),
                                        getattr(g, "member_epoch", -1))
            error, topics = (error, []) if error != ErrorCode.none else await _fetch(broker, ctx, g.group_id,
                                                                                     g.topics, stable)
            groups.append(make(mod.OffsetFetchResponseGroup, group_id=g.group_id, error_code=error,
                               topics=_topics(mod, topics, "OffsetFetchResponseTopics",
                                              "OffsetFetchResponsePartitions")))
        return make(mod.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=tuple(groups))
    error, topics = await _fetch(broker, ctx, req.group_id, req.topics, stable)
    if ctx.api_version < 2 and error != ErrorCode.none:
        # v0-v1 have no group-level error: every requested partition carries it.
        topics = [(t.name, [(p, -1, -1, "", error) for p in t.partition_indexes]) for t in req.topics]
    return make(mod.OffsetFetchResponse, throttle_time=NO_THROTTLE, error_code=error,
                topics=_topics(mod, topics, "OffsetFetchResponseTopic", "OffsetFetchResponsePartition"))


async def _check_member(broker: Broker, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
    """v9: a member of a consumer-protocol group reads at its current epoch. Checked where this shard coordinates
    the group (a client asks its coordinator); a request that reached another shard is answered unchecked."""
    if member_id is None and member_epoch < 0:
        return ErrorCode.none
    error, coordinator = await broker.groups.lookup(group_id)
    if error == ErrorCode.none and coordinator is not None and isinstance(coordinator.group, ConsumerGroup):
        return coordinator.group.check_fetch(member_id, member_epoch)
    return ErrorCode.none


async def _fetch(broker: Broker, ctx: RequestContext, group_id: str, requested: Any,
                 require_stable: bool) -> tuple[ErrorCode, Topics]:
    if not allowed(broker, ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
        return ErrorCode.group_authorization_failed, []
    unstable: set[tuple[str, int]] = set()
    if require_stable:
        # Read before the offsets: a transaction completing in between then answers UNSTABLE (asked again),
        # never its old committed offset as stable.
        error, unstable = await broker.groups.unstable(group_id)
        if error != ErrorCode.none:
            return error, []
    answer = await broker.group_offsets(group_id)  # from the coordinator, wherever it moved
    if answer.error != ErrorCode.none:
        return ErrorCode(answer.error), []
    offsets = answer.offsets
    if requested is None:  # every partition the group has committed
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(offsets):
            by_topic.setdefault(topic, []).append(partition)
        # Only the topics the principal may describe (Kafka leaves the others out).
        wanted = [(t, ps) for t, ps in by_topic.items() if allowed(broker, ctx, Operation.DESCRIBE,
                                                                   ResourceType.TOPIC, t)]
    else:
        wanted = [(t.name, list(t.partition_indexes)) for t in requested]
    topics: Topics = []
    for topic, partitions in wanted:
        rows = []
        if not allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic):
            topics.append((topic, [(p, -1, -1, "", ErrorCode.topic_authorization_failed) for p in partitions]))
            continue
        for p in partitions:
            entry = offsets.get((topic, p))
            if (topic, p) in unstable:
                rows.append((p, -1, -1, "", ErrorCode.unstable_offset_commit))
            elif entry is None:
                rows.append((p, -1, -1, "", ErrorCode.none))
            else:
                rows.append((p, entry.offset, entry.leader_epoch, entry.metadata, ErrorCode.none))
        topics.append((topic, rows))
    return ErrorCode.none, topics


def _topics(mod: ModuleType, topics: Topics, topic_cls: str, partition_cls: str) -> tuple[Any, ...]:
    return tuple(
        make(getattr(mod, topic_cls), name=name, partitions=tuple(
            make(getattr(mod, partition_cls), partition_index=p, committed_offset=offset,
                 committed_leader_epoch=epoch, metadata=metadata, error_code=error)
            for p, offset, epoch, metadata, error in rows))
        for name, rows in topics)
