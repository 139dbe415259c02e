"""TxnOffsetCommit v0-v5: a transactional producer's offsets for a group (sendOffsetsToTransaction), sent to the
group's coordinator after AddOffsetsToTxn (v0-v4) or instead of it (v5, transactions v2: the group joins the
transaction here). They stay pending, invisible to OffsetFetch, until the transaction's coordinator completes the
transaction here (kafscale/groups/txn_offsets.py); acknowledged once durable.

Checks in Kafka's order (KafkaApis, then the group coordinator): WRITE on the transactional id, READ on the
group (each fails every partition), READ on each topic, the topic partition's existence; then the group: an
empty group id, the coordinator, the member and generation (v3+, KIP-447), metadata size, the producer epoch."""

from __future__ import annotations

import time
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.groups.offsets import MAX_METADATA_BYTES, OffsetEntry
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 28, 0, 5
ADDS_TO_TXN_SINCE = 5  # transactions v2 (KIP-890 part 2)

Errors = dict[tuple[str, int], ErrorCode]


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    errors = await _commit(req, broker, ctx)
    mod = response_module(ctx)
    topics = tuple(
        make(mod.TxnOffsetCommitResponseTopic, name=t.name, partitions=tuple(
            make(mod.TxnOffsetCommitResponsePartition, partition_index=p.partition_index,
                 error_code=errors[(t.name, p.partition_index)]) for p in t.partitions))
        for t in req.topics)
    return make(mod.TxnOffsetCommitResponse, throttle_time=NO_THROTTLE, topics=topics)


def _all(req: Any, error: ErrorCode) -> Errors:
    return {(t.name, p.partition_index): error for t in req.topics for p in t.partitions}


async def _commit(req: Any, broker: Broker, ctx: RequestContext) -> Errors:
    if not allowed(broker, ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id):
        return _all(req, ErrorCode.transactional_id_authorization_failed)
    if not allowed(broker, ctx, Operation.READ, ResourceType.GROUP, req.group_id):
        return _all(req, ErrorCode.group_authorization_failed)
    now_ms = int(time.time() * 1000)
    errors: Errors = {}
    entries: list[tuple[str, int, OffsetEntry]] = []
    too_large: list[tuple[str, int]] = []
    for t in req.topics:
        info = await broker.topics.get(t.name)
        readable = allowed(broker, ctx, Operation.READ, ResourceType.TOPIC, t.name)
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            metadata = p.committed_metadata or ""
            if not readable:
                errors[tp] = ErrorCode.topic_authorization_failed
            elif info is None or not 0 <= p.partition_index < info.partitions:
                errors[tp] = ErrorCode.unknown_topic_or_partition
            elif len(metadata.encode()) > MAX_METADATA_BYTES:
                too_large.append(tp)
            else:
                entries.append((t.name, p.partition_index, OffsetEntry(
                    offset=p.committed_offset, leader_epoch=getattr(p, "committed_leader_epoch", -1),  # v2+
                    metadata=metadata, commit_ms=now_ms, topic_id=str(info.id))))
    if not entries and not too_large:
        return errors
    error = await _to_group(req, broker, entries, ctx.api_version)
    for t, p, _ in entries:
        errors[(t, p)] = error
    for tp in too_large:  # the group's own error comes first (Kafka validates the group, then each partition)
        errors[tp] = error if error != ErrorCode.none else ErrorCode.offset_metadata_too_large
    return errors


async def _verified(req: Any, broker: Broker, version: int) -> ErrorCode:
    """KIP-890 part 1: the transaction's coordinator confirms that AddOffsetsToTxn put the group in the producer's
    open transaction, so a fenced (zombie) producer's offsets are never taken. Part 2 (v5): it adds the group."""
    try:
        code = ErrorCode((await broker.verify_txn(req.transactional_id, req.producer_id, req.producer_epoch, [],
                                                  req.group_id, add=version >= ADDS_TO_TXN_SINCE))[-1])
    except Exception:
        code = ErrorCode.coordinator_not_available
    if code in (ErrorCode.producer_fenced, ErrorCode.invalid_producer_id_mapping):
        return ErrorCode.invalid_producer_epoch
    if code == ErrorCode.invalid_txn_state and version >= 4:
        return ErrorCode.transaction_abortable  # KIP-1050: v4 clients abort and carry on
    if code in (ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress,
                ErrorCode.concurrent_transactions):
        return ErrorCode.coordinator_not_available  # the client retries
    return code


async def _to_group(req: Any, broker: Broker, entries: list[tuple[str, int, OffsetEntry]],
                    version: int) -> ErrorCode:
    if not req.group_id:
        return ErrorCode.invalid_group_id
    generation = getattr(req, "generation_id", -1)  # v3+ (KIP-447); older versions name no member
    error, coordinator = await broker.groups.lookup(req.group_id, create=generation < 0)
    if error != ErrorCode.none:
        return error
    if coordinator is None:  # a generation for a group that does not exist
        return ErrorCode.illegal_generation
    error = await _verified(req, broker, version)
    if error != ErrorCode.none:
        return error
    return await coordinator.txn_commit(req.producer_id, req.producer_epoch, req.transactional_id,
                                        getattr(req, "member_id", ""), getattr(req, "group_instance_id", None),
                                        generation, entries)
