"""OffsetCommit and OffsetFetch: a virtual topic's committed offsets live in its companion topic upstream
(kafscale.proxy.topics), partition for virtual partition; the offsets themselves need no translation."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import nested, replace
from kafscale.proxy.handlers.create_topics import UpstreamRefused, create_upstream
from kafscale.proxy.handlers.groups import to_coordinator
from kafscale.proxy.state import Call
from kafscale.proxy.topics import offsets_topic, offsets_topic_of

COMMIT, FETCH = 8, 9
log = logging.getLogger(__name__)
VERSIONS = {COMMIT: (2, 8), FETCH: (1, 7)}


async def handle(call: Call, request: Any) -> Any:
    return await (commit(call, request) if request.__api_key__ == COMMIT else fetch(call, request))


async def _companions(call: Call, names: list[str]) -> dict[str, ErrorCode]:
    """Make sure the virtual topics' companions exist; the topics whose companion the upstream refused, with its
    answer (their partitions get it as their error)."""
    refused = {}
    for name in [n for n in names if n not in call.proxy.topics.offsets_ready]:
        try:
            await create_upstream(call, [name], companions_only=True)
        except UpstreamRefused as e:
            log.warning("%s: commits of %s are refused", e, name)
            refused[name] = e.error_code
    return refused


async def commit(call: Call, request: Any) -> Any:
    refused: dict[str, list[tuple[int, ErrorCode]]] = defaultdict(list)
    topics = []
    without = await _companions(call, [t.name for t in request.topics if call.proxy.topics.layout(t.name)])
    for topic in request.topics:
        layout = call.proxy.topics.layout(topic.name)
        if layout is None:
            topics.append(topic)
            continue
        good = []
        for p in topic.partitions:
            if topic.name in without:
                refused[topic.name].append((p.partition_index, without[topic.name]))
            elif not 0 <= p.partition_index < layout.virtual:
                refused[topic.name].append((p.partition_index, ErrorCode.unknown_topic_or_partition))
            else:
                good.append(p)
        if good:
            topics.append(replace(topic, name=offsets_topic(topic.name), partitions=tuple(good)))
    answer = await to_coordinator(call, request.group_id, replace(request, topics=tuple(topics)))
    cls = type(answer)
    topic_cls, part_cls = nested(cls, "OffsetCommitResponseTopic"), nested(cls, "OffsetCommitResponsePartition")
    results = [replace(t, name=offsets_topic_of(t.name) or t.name) for t in answer.topics]
    for name, partitions in refused.items():
        results.append(topic_cls(name=name, partitions=tuple(
            part_cls(partition_index=p, error_code=error) for p, error in partitions)))
    return replace(answer, topics=tuple(_merge(results)))


async def fetch(call: Call, request: Any) -> Any:
    if request.topics is not None:
        virtual = [t.name for t in request.topics if call.proxy.topics.layout(t.name) is not None]
        await _companions(call, virtual)  # one refused: its partitions come back UNKNOWN_TOPIC_OR_PARTITION, below
        renamed = tuple(replace(t, name=offsets_topic(t.name)) if t.name in virtual else t
                        for t in request.topics)
        request = replace(request, topics=renamed)
    answer = await to_coordinator(call, request.group_id, request)
    topics = []
    for topic in answer.topics:
        name = offsets_topic_of(topic.name)
        if name is None:
            if request.topics is None and call.proxy.topics.layout(topic.name) is not None:
                continue  # commits on a virtual topic's physical partitions, made around the proxy
            topics.append(topic)
            continue
        ready = name in call.proxy.topics.offsets_ready  # its companion exists: unknown there means no commit yet
        parts = tuple(replace(p, committed_offset=-1, error_code=ErrorCode.none, metadata="")
                      if ready and p.error_code == ErrorCode.unknown_topic_or_partition else p
                      for p in topic.partitions)
        topics.append(replace(topic, name=name, partitions=parts))
    return replace(answer, topics=tuple(topics))


def _merge(topics: list[Any]) -> list[Any]:
    by_name: dict[str, Any] = {}
    for topic in topics:
        if topic.name in by_name:
            by_name[topic.name] = replace(by_name[topic.name],
                                                      partitions=by_name[topic.name].partitions + topic.partitions)
        else:
            by_name[topic.name] = topic
    return list(by_name.values())

