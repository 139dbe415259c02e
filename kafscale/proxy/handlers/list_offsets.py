"""ListOffsets: a virtual partition's offsets are its physical partition's (kafscale.proxy.records), so the
earliest, the latest and the first at a timestamp are asked of the physical partition. The latest is its high
watermark; the first at a timestamp may be another virtual partition's record, which a Fetch from there skips."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import make, nested, replace, response_class
from kafscale.proxy.handlers.routing import Key, Target, by_topic, forward, split
from kafscale.proxy.state import Call

API_KEY, MIN_VERSION, MAX_VERSION = 2, 1, 7


async def handle(call: Call, request: Any) -> Any:
    outcome, parts = split(call, ((t.name, p.partition_index, p) for t in request.topics for p in t.partitions),
                           lambda part, physical: replace(part, partition_index=physical))
    topic_cls = nested(type(request), "ListOffsetsTopic")

    async def send(node: int, group: list[tuple[Target, Any]], _first: bool) -> dict[Key, Any]:
        upstream = replace(request, topics=tuple(
            topic_cls(name=name, partitions=tuple(ps)) for name, ps in by_topic(group).items()))
        answer = await call.session.send(upstream, node)
        return {(t.name, p.partition_index): p for t in answer.topics for p in t.partitions}

    outcome |= await forward(call, parts, send)
    response = response_class(API_KEY, request.__version__)
    rtopic_cls = nested(response, "ListOffsetsTopicResponse")
    part_cls = nested(response, "ListOffsetsPartitionResponse")

    def answer(index: int, found: Any) -> Any:
        if isinstance(found, ErrorCode):
            return make(part_cls, partition_index=index, error_code=found, timestamp=-1, offset=-1,
                        leader_epoch=-1, old_style_offsets=())
        return replace(found, partition_index=index)

    return make(response, throttle_time=0, topics=tuple(
        make(rtopic_cls, name=t.name, partitions=tuple(answer(p.partition_index, outcome[(t.name, p.partition_index)])
                                                       for p in t.partitions))
        for t in request.topics))
