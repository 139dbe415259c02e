"""Fetch: a virtual partition's records are its physical partition's batches that carry its tag.

Each requested virtual partition is fetched from its physical partition at its own offset (the offsets are the
same, kafscale.proxy.records), so two virtual partitions of one physical partition go upstream in separate
requests and each gets all of its own records. Fetch sessions (KIP-227) are not offered: every answer says
session 0, so clients send full requests, and upstream fetches are sessionless too.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import make, nested, replace, response_class
from kafscale.proxy.handlers.routing import Key, Target, by_topic, forward, split
from kafscale.proxy.records import keep_lane
from kafscale.proxy.state import Call

API_KEY, MIN_VERSION, MAX_VERSION = 1, 4, 12
NO_SESSION, SESSIONLESS = 0, -1
LATER_ROUND_WAIT = datetime.timedelta(milliseconds=1)


async def handle(call: Call, request: Any) -> Any:
    outcome, parts = split(call, ((t.topic, p.partition, p) for t in request.topics for p in t.partitions),
                           lambda part, physical: replace(part, partition=physical))
    topic_cls = nested(type(request), "FetchTopic")
    top_error = ErrorCode.none
    throttle = datetime.timedelta(0)

    async def send(node: int, group: list[tuple[Target, Any]], first: bool) -> dict[Key, Any]:
        nonlocal top_error, throttle
        upstream = replace(request, session_id=NO_SESSION, session_epoch=SESSIONLESS, forgotten_topics_data=(),
                           rack_id="", topics=tuple(topic_cls(topic=name, partitions=tuple(ps))
                                                    for name, ps in by_topic(group).items()))
        if not first:  # only the first round waits for data (handlers.routing); 1 ms, not 0: Tansu answers a
            # Fetch with max_wait 0 with no partitions at all
            upstream = replace(upstream, max_wait=min(request.max_wait, LATER_ROUND_WAIT), min_bytes=0)
        answer = await call.session.send(upstream, node)
        throttle = max(throttle, answer.throttle_time)
        if getattr(answer, "error_code", ErrorCode.none) != ErrorCode.none:  # v7+
            top_error = answer.error_code
        return {(t.topic, p.partition_index): p for t in answer.responses for p in t.partitions}

    outcome |= await forward(call, parts, send, missing=ErrorCode.none)
    response = response_class(API_KEY, request.__version__)
    rtopic_cls, part_cls = nested(response, "FetchableTopicResponse"), nested(response, "PartitionData")

    def answer(topic: str, part: Any) -> Any:
        found = outcome[(topic, part.partition)]
        if isinstance(found, ErrorCode):  # NONE: the upstream's answer left the partition out, it has nothing now
            return make(part_cls, partition_index=part.partition, error_code=found, high_watermark=-1,
                        last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                        preferred_read_replica=-1, records=b"")
        layout = call.proxy.topics.layout(topic)
        if layout is None or found.error_code != ErrorCode.none or not found.records:
            # null records (as Tansu sends for nothing) are empty ones to clients: librdkafka refuses a null
            return replace(found, partition_index=part.partition, preferred_read_replica=-1,
                           records=found.records or b"")
        kept = keep_lane(found.records, topic, part.partition, (layout.physical, layout.virtual), part.fetch_offset,
                         call.proxy.lanes)
        call.proxy.metrics.batches_kept.inc(kept.kept)
        call.proxy.metrics.batches_dropped.inc(kept.dropped)
        return replace(found, partition_index=part.partition, records=kept.records, preferred_read_replica=-1)

    return make(response, throttle_time=throttle, error_code=top_error, session_id=NO_SESSION, responses=tuple(
        make(rtopic_cls, topic=t.topic, partitions=tuple(answer(t.topic, p) for p in t.partitions))
        for t in request.topics))

