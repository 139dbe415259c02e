"""AddPartitionsToTxn v0-v5: partitions join the producer's transaction (durable before the answer).

v0-v3 come from clients: one transaction, the transactional id needs WRITE and every topic WRITE. v4+ come from
brokers (KIP-890 part 1): a batch of transactions, CLUSTER_ACTION on the cluster, and `verify_only` asks whether
partitions are already in the open transaction without adding them. Errors are Kafka's, per partition: a
partition that cannot be added fails the whole transaction's request, the others are OPERATION_NOT_ATTEMPTED.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, allowed_on_cluster, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 24, 0, 5
BATCHED_SINCE = 4
PRODUCER_FENCED_SINCE = 2  # older versions are told INVALID_PRODUCER_EPOCH instead, as Kafka does

Partitions = list[tuple[str, int]]


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    if ctx.api_version < BATCHED_SINCE:
        partitions = [(t.name, int(p)) for t in req.v3_and_below_topics for p in t.partitions]
        errors = await _one(broker, ctx, req.v3_and_below_transactional_id, int(req.v3_and_below_producer_id),
                            int(req.v3_and_below_producer_epoch), partitions, verify_only=False)
        return make(mod.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE,
                    results_by_topic_v3_and_below=_topic_results(mod, partitions, errors))
    if not allowed_on_cluster(broker, ctx, Operation.CLUSTER_ACTION):
        return make(mod.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.cluster_authorization_failed, results_by_transaction=())
    results = []
    for txn in req.transactions:
        partitions = [(t.name, int(p)) for t in txn.topics for p in t.partitions]
        errors = await _one(broker, ctx, txn.transactional_id, int(txn.producer_id), int(txn.producer_epoch),
                            partitions, verify_only=bool(txn.verify_only))
        results.append(make(mod.AddPartitionsToTxnResult, transactional_id=txn.transactional_id,
                            topic_results=_topic_results(mod, partitions, errors)))
    return make(mod.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                results_by_transaction=tuple(results))


async def _one(broker: Broker, ctx: RequestContext, tid: str, pid: int, epoch: int, partitions: Partitions, *,
               verify_only: bool) -> dict[tuple[str, int], ErrorCode]:
    """One transaction's partitions: Kafka's checks in Kafka's order, then the coordinator."""
    client = ctx.api_version < BATCHED_SINCE  # brokers (v4+) are trusted with the topics and the id
    if client and not allowed(broker, ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
        return dict.fromkeys(partitions, ErrorCode.transactional_id_authorization_failed)
    failed: dict[tuple[str, int], ErrorCode] = {}
    for topic in dict.fromkeys(t for t, _ in partitions):
        if client and not allowed(broker, ctx, Operation.WRITE, ResourceType.TOPIC, topic):
            failed.update({tp: ErrorCode.topic_authorization_failed for tp in partitions if tp[0] == topic})
            continue
        info = await broker.topics.get(topic)
        failed.update({tp: ErrorCode.unknown_topic_or_partition for tp in partitions
                       if tp[0] == topic and (info is None or not 0 <= tp[1] < info.partitions)})
    if failed:
        return {tp: failed.get(tp, ErrorCode.operation_not_attempted) for tp in partitions}
    if verify_only:
        return await broker.transactions.verify_partitions(tid, pid, epoch, partitions)
    code = await broker.transactions.add_partitions(tid, pid, epoch, partitions)
    if code == ErrorCode.producer_fenced and ctx.api_version < PRODUCER_FENCED_SINCE:
        code = ErrorCode.invalid_producer_epoch
    return dict.fromkeys(partitions, code)


def _topic_results(mod: Any, partitions: Partitions, errors: dict[tuple[str, int], ErrorCode]) -> tuple[Any, ...]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        if partition not in by_topic.setdefault(topic, []):
            by_topic[topic].append(partition)
    return tuple(make(mod.AddPartitionsToTxnTopicResult, name=topic, results_by_partition=tuple(
        make(mod.AddPartitionsToTxnPartitionResult, partition_index=p, partition_error_code=errors[(topic, p)])
        for p in ps)) for topic, ps in by_topic.items())
