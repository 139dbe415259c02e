"""OffsetCommit v0-v9: group members (checked against member id and generation, or member epoch in a
consumer-protocol group, which takes v9 or later as in Kafka) and standalone commits (generation -1, into a
group that has no members). Acknowledged only once durable in the metadata store:
every partition of the request in one fenced transaction (kafscale/groups/coordinator.py).

v0 names no member and no generation: it is a standalone commit. (ZooKeeper-era Kafka kept v0 commits in
ZooKeeper, apart from the others; Kafka 3.9 in KRaft mode answers v0 with UNSUPPORTED_VERSION in every
partition. Kafscale has one offset store and serves v0 from it: docs/compatibility.md.) v1 may give each
partition's commit time (-1: now), from which the offset's retention counts."""

from __future__ import annotations

import time
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, ms, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.groups.offsets import MAX_METADATA_BYTES, OffsetEntry
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 8, 0, 9


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    errors = await _commit(req, broker, ctx)
    mod = response_module(ctx)
    topics = tuple(
        make(mod.OffsetCommitResponseTopic, name=t.name, partitions=tuple(
            make(mod.OffsetCommitResponsePartition, partition_index=p.partition_index,
                 error_code=errors[(t.name, p.partition_index)]) for p in t.partitions))
        for t in req.topics)
    return make(mod.OffsetCommitResponse, throttle_time=NO_THROTTLE, topics=topics)


async def _commit(req: Any, broker: Broker, ctx: RequestContext) -> dict[tuple[str, int], ErrorCode]:
    if not allowed(broker, ctx, Operation.READ, ResourceType.GROUP, req.group_id):
        return {(t.name, p.partition_index): ErrorCode.group_authorization_failed for t in req.topics
                for p in t.partitions}
    now_ms = int(time.time() * 1000)
    retention = ms(getattr(req, "retention_time", None), -1)  # v2-v4 only; -1: the broker's retention
    errors: dict[tuple[str, int], ErrorCode] = {}
    entries: list[tuple[str, int, OffsetEntry]] = []
    for t in req.topics:
        info = await broker.topics.get(t.name)
        readable = allowed(broker, ctx, Operation.READ, ResourceType.TOPIC, t.name)
        for p in t.partitions:
            metadata = p.committed_metadata or ""
            if not readable:
                errors[(t.name, p.partition_index)] = ErrorCode.topic_authorization_failed
            elif info is None or not 0 <= p.partition_index < info.partitions:
                errors[(t.name, p.partition_index)] = ErrorCode.unknown_topic_or_partition
            elif len(metadata.encode()) > MAX_METADATA_BYTES:
                errors[(t.name, p.partition_index)] = ErrorCode.offset_metadata_too_large
            else:
                commit_ms = getattr(p, "commit_timestamp", -1)  # v1 only
                entries.append((t.name, p.partition_index, OffsetEntry(
                    offset=p.committed_offset, leader_epoch=getattr(p, "committed_leader_epoch", -1),
                    metadata=metadata, commit_ms=now_ms if commit_ms < 0 else commit_ms,
                    expire_ms=now_ms + retention if retention >= 0 else None, topic_id=str(info.id))))
    if not entries:
        return errors
    generation = getattr(req, "generation_id_or_member_epoch", -1)  # v0: a standalone commit
    error, coordinator = await broker.groups.lookup(req.group_id, create=generation < 0)
    if error == ErrorCode.none:
        if coordinator is None:  # a generation for a group that does not exist
            error = ErrorCode.illegal_generation
        else:
            errors.update(await coordinator.commit(getattr(req, "member_id", ""),
                                                   getattr(req, "group_instance_id", None), generation, entries,
                                                   ctx.api_version))
            return errors
    for t, p, _ in entries:
        errors[(t, p)] = error
    return errors
