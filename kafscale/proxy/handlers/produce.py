"""Produce: each virtual partition's batches are tagged and written to its physical partition.

A Produce request names each partition once, so virtual partitions sharing a physical one go upstream in
separate requests (kafscale.proxy.handlers.routing). An idempotent producer's batches are written under the
upstream producer id of their (producer, virtual partition) (kafscale.proxy.producers). The offsets the upstream
assigns are the virtual partition's (kafscale.proxy.records). Transactional produces are refused, as
InitProducerId refuses transactional producers.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import make, nested, replace, response_class
from kafscale.proxy.handlers.routing import Key, Target, by_topic, forward, place
from kafscale.proxy.records import TagError, producer_of, tag
from kafscale.proxy.state import Call
from kafscale.storage.batch import InvalidBatchError

API_KEY, MIN_VERSION, MAX_VERSION = 0, 3, 9


async def handle(call: Call, request: Any) -> Any:
    outcome: dict[Key, Any] = {}
    messages: dict[Key, str] = {}
    parts: list[tuple[Target, Any]] = []
    for topic in request.topic_data:
        for part in topic.partition_data:
            key = (topic.name, part.index)
            physical = place(call, topic.name, part.index)
            if request.transactional_id is not None:
                physical = ErrorCode.transactional_id_authorization_failed
            if isinstance(physical, ErrorCode):
                outcome[key] = physical
                continue
            records = part.records or b""
            if call.proxy.topics.layout(topic.name) is not None:
                try:
                    records = await _tagged(call, topic.name, part.index, records)
                except InvalidBatchError as e:
                    outcome[key], messages[key] = ErrorCode(e.error_code), str(e)
                    continue
                except TagError as e:
                    outcome[key], messages[key] = ErrorCode.corrupt_message, str(e)
                    continue
            parts.append((Target(topic.name, part.index, physical),
                          replace(part, index=physical, records=records)))
    topic_cls = nested(type(request), "TopicProduceData")

    throttle = datetime.timedelta(0)

    async def send(node: int, group: list[tuple[Target, Any]], _first: bool) -> dict[Key, Any]:
        nonlocal throttle
        upstream = replace(request, topic_data=tuple(
            topic_cls(name=name, partition_data=tuple(ps)) for name, ps in by_topic(group).items()))
        if request.acks == 0:
            await call.session.send_only(upstream, node)
            return {}
        answer = await call.session.send(upstream, node)
        throttle = max(throttle, answer.throttle_time)  # the upstream's quota: the client must back off
        return {(t.name, p.index): p for t in answer.responses for p in t.partition_responses}

    outcome |= await forward(call, parts, send)
    if request.acks == 0:
        return None
    response = response_class(API_KEY, request.__version__)
    rtopic_cls, part_cls = nested(response, "TopicProduceResponse"), nested(response, "PartitionProduceResponse")

    def answer(key: Key) -> Any:
        found = outcome[key]
        if isinstance(found, ErrorCode):
            return make(part_cls, index=key[1], error_code=found, base_offset=-1, log_append_time=None,
                        log_start_offset=-1, record_errors=(), error_message=messages.get(key))
        return replace(found, index=key[1])

    return make(response, throttle_time=throttle, responses=tuple(
        make(rtopic_cls, name=t.name, partition_responses=tuple(answer((t.name, p.index)) for p in t.partition_data))
        for t in request.topic_data))


async def _tagged(call: Call, topic: str, partition: int, records: bytes) -> bytes:
    producer = None
    pid, epoch = producer_of(records)
    if pid >= 0 and call.proxy.producers is not None:
        producer = await call.proxy.producers.upstream(pid, epoch, topic, partition)
    tagged = tag(records, partition, producer)
    call.proxy.metrics.tagged.inc()
    return tagged
