"""Produce v0-v12: hand each partition's batches to its owner; answer per acks.

v0-v2 carry legacy message sets (magic 0 and 1), which are converted to one v2 batch per partition before the
owner sees them (kafscale/acceptor/legacy.py), as Kafka 3.9 converts them; v3+ carry v2 batches, which go to the
owner as they came. Clients negotiate the highest common version, so only a client that knows nothing newer sends
v0-v2 (sarama with an old Config.Version, kafka-go 0.2, kafka-python with api_version below (0, 11)).
"""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode

from kafscale.acceptor import legacy
from kafscale.acceptor.blocked_producers import PLAIN, producer_id, record_count
from kafscale.acceptor.handlers.common import allowed, new_leader
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker, ProduceItem
from kafscale.broker.results import ProduceResult
from kafscale.protocol import produce_codec
from kafscale.protocol.produce_codec import (
    EncodedResponse,
    Leaders,
    ProduceRequestData,
    encode_produce_response,
    read_produce_request,
)
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = produce_codec.API_KEY, 0, 12
FIRST_V2_VERSION = 3  # v0-v2 carry legacy (magic 0/1) message sets
ADDS_TO_TXN_SINCE = 12  # transactions v2 (KIP-890 part 2): a transactional batch adds its partition itself


# Not a coroutine: the answer is a future the shard completes from its callbacks (no task per
# request, see kafscale.broker.produce_wait), and the request is read by produce_codec, not kio.
def handle(broker: Broker, ctx: RequestContext, req: ProduceRequestData) -> asyncio.Future[EncodedResponse | None]:
    acks = req.acks
    jobs: list[ProduceItem] = []
    errors: dict[tuple[str, int], ProduceResult] = {}
    authorizer = broker.acls.authorizer  # None: no authorizer, nothing to check on the hot path
    txn_refused = (req.transactional_id is not None and authorizer is not None
                   and not allowed(broker, ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id))
    for topic in req.topic_data:
        writable = authorizer is None or allowed(broker, ctx, Operation.WRITE, ResourceType.TOPIC, topic.name)
        for part in topic.partition_data:
            key = (topic.name, part.index)
            if not writable:
                errors[key] = ProduceResult(int(ErrorCode.topic_authorization_failed))
            elif acks not in (-1, 0, 1):
                errors[key] = ProduceResult(int(ErrorCode.invalid_required_acks))
            elif txn_refused:
                errors[key] = ProduceResult(int(ErrorCode.transactional_id_authorization_failed))
            elif part.records is None:
                errors[key] = ProduceResult(int(ErrorCode.invalid_record), message="no records")
            elif ctx.api_version < FIRST_V2_VERSION:
                converted = legacy.produce_records(broker, topic.name, part.index, part.records)
                if isinstance(converted, ProduceResult):
                    errors[key] = converted
                else:
                    jobs.append((topic.name, part.index, converted))
            else:
                jobs.append((topic.name, part.index, part.records))  # the reader's own copy

    def answer(results: list[ProduceResult]) -> EncodedResponse | None:
        if acks == 0:
            return None
        answers = dict(errors)
        leaders: Leaders = {}
        endpoints: dict[int, tuple[int, str, int]] = {}
        for (t, p, _), result in zip(jobs, results, strict=True):
            answers[(t, p)] = result
            if result.error == ErrorCode.not_leader_or_follower and ctx.api_version >= 10:
                found = new_leader(broker, t, p)  # KIP-951: the client goes there without a metadata refresh
                if found is not None:
                    leaders[(t, p)] = (found[0], found[1])
                    endpoints[found[0]] = (found[0], *found[2].on(ctx.listener.name))
        return encode_produce_response(ctx.api_version, ctx.correlation_id, [
            (topic.name, [(part.index, answers[(topic.name, part.index)]) for part in topic.partition_data])
            for topic in req.topic_data
        ], leaders, list(endpoints.values()))

    answered = broker.start_produce(jobs, acks, req.timeout_ms, answer, req.transactional_id,
                                    add_to_txn=ctx.api_version >= ADDS_TO_TXN_SINCE)
    if acks == -1 and jobs and ctx.produce_waits is not None and not answered.done():
        producer, waits = producer_id(jobs[0][2]), ctx.produce_waits
        if producer != PLAIN or not waits.counts_records:  # librdkafka's plain producer is never at a limit
            counted = [(t, p, record_count(records) if waits.counts_records else 0) for t, p, records in jobs]
            waits.track(answered, producer, counted, broker.flush_now)
    return answered


DECODE = read_produce_request  # the codec reads Produce requests itself, without kio
