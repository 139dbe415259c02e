"""Fetch v0-v17: one long-poll over every requested partition (max wait, min bytes, max bytes), with fetch sessions
from v7 on (KIP-227, kafscale/broker/fetch_sessions.py): an incremental fetch reads its session's partitions and is
answered with the ones that changed.

v0-v3 predate the v2 batch format: their answers are the stored batches converted to magic 0 (v0-v1) or magic 1
(v2-v3) message sets, sized as Kafka sizes them (kafscale/acceptor/legacy.py)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor import legacy
from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, ms, new_leader, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.fetch_sessions import FINAL_EPOCH, CachedPartition, FetchPlan, SessionKey
from kafscale.broker.interface import Broker, FetchItem
from kafscale.broker.results import FetchResult
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 1, 0, 17
FIRST_V2_VERSION = 4  # v0-v3 carry legacy (magic 0/1) message sets
FIRST_SESSION_VERSION = 7


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    by_id = ctx.api_version >= 13
    # A partition named twice is answered once, where it was first named, and fetched at the offset it was last
    # named with, as Kafka does (its request is a map).
    requested: dict[SessionKey, CachedPartition] = {}
    for topic in req.topics:
        ident: Any = topic.topic_id if by_id else topic.topic
        name = _name(broker, topic.topic_id) if by_id else topic.topic
        for p in topic.partitions:
            requested[(ident, int(p.partition))] = CachedPartition(name, int(p.fetch_offset),
                                                                   int(p.partition_max_bytes))
    if ctx.api_version >= FIRST_SESSION_VERSION:
        forgotten = [(t.topic_id if by_id else t.topic, int(p)) for t in req.forgotten_topics_data
                     for p in t.partitions]
        plan = broker.fetch_sessions.plan(int(req.session_id), int(req.session_epoch), requested, forgotten, by_id)
    else:
        plan = FetchPlan(partitions=requested, epoch=FINAL_EPOCH)
    results = await _fetch(broker, ctx, req, plan)
    answer = broker.fetch_sessions.answer(plan, results, by_id)
    mod = response_module(ctx)
    grouped: dict[Any, list[Any]] = {}
    endpoints: dict[int, Any] = {}
    for ident, partition in answer.keys:
        r, name = results[(ident, partition)], plan.partitions[(ident, partition)].name
        leader = {}
        if r.error == ErrorCode.not_leader_or_follower and name is not None and ctx.api_version >= 16:
            found = new_leader(broker, name, partition)  # KIP-951: the client goes there without a refresh
            if found is not None:
                leader = {"current_leader": make(mod.LeaderIdAndEpoch, leader_id=found[0], leader_epoch=found[1])}
                host, port = found[2].on(ctx.listener.name)
                endpoints[found[0]] = make(mod.NodeEndpoint, node_id=found[0], host=host, port=port, rack=None)
        failed = r.error != ErrorCode.none  # Kafka tells no offsets with an error (-1 for each)
        lso = r.last_stable_offset if r.last_stable_offset >= 0 else r.high_watermark
        grouped.setdefault(ident, []).append(make(
            mod.PartitionData,
            **leader,
            partition_index=partition,
            error_code=ErrorCode(r.error),
            high_watermark=-1 if failed else r.high_watermark,
            last_stable_offset=-1 if failed else lso,
            log_start_offset=-1 if failed else r.log_start_offset,
            aborted_transactions=None if r.error or r.aborted is None else tuple(
                make(mod.AbortedTransaction, producer_id=pid, first_offset=first) for pid, first in r.aborted),
            preferred_read_replica=-1,
            records=r.records,
        ))
    key = "topic_id" if by_id else "topic"
    responses = tuple(make(mod.FetchableTopicResponse, **{key: ident}, partitions=tuple(ps))
                      for ident, ps in grouped.items())
    return make(mod.FetchResponse, throttle_time=NO_THROTTLE, error_code=answer.error, session_id=answer.session_id,
                responses=responses, **({"node_endpoints": tuple(endpoints.values())} if endpoints else {}))


def _name(broker: Broker, topic_id: Any) -> str | None:
    info = broker.topics.by_id.get(topic_id)
    return info.name if info else None


async def _fetch(broker: Broker, ctx: RequestContext, req: Any, plan: FetchPlan) -> dict[SessionKey, FetchResult]:
    """Every partition of the plan, in its order: the readable ones from the broker, the others their error."""
    if plan.error:
        return {}
    results: dict[SessionKey, FetchResult] = {}
    readable: dict[str, bool] = {}
    keys: list[SessionKey] = []
    parts: list[FetchItem] = []
    for key, cached in plan.partitions.items():
        name = cached.name
        if name is None:
            results[key] = FetchResult(int(ErrorCode.unknown_topic_id))
            continue
        if name not in readable:
            readable[name] = allowed(broker, ctx, Operation.READ, ResourceType.TOPIC, name)
        if not readable[name]:
            results[key] = FetchResult(int(ErrorCode.topic_authorization_failed))
            continue
        results[key] = FetchResult(0)  # holds the key's place in the plan's order
        keys.append(key)
        parts.append((name, key[1], cached.fetch_offset, cached.max_bytes))
    max_bytes = int(getattr(req, "max_bytes", 0x7FFFFFFF))  # v3+
    isolation = int(getattr(req, "isolation_level", 0))  # v4+; 1: read_committed
    answers = await broker.fetch(parts, ms(req.max_wait), int(req.min_bytes), max_bytes, isolation)
    if ctx.api_version < FIRST_V2_VERSION:
        answers = legacy.fetch_results(broker, ctx.api_version, parts, answers, max_bytes)
    results.update(zip(keys, answers, strict=True))
    return results
