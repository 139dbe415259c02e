"""Metadata: the proxy is the one broker, leading every partition; a virtual topic shows V partitions.

The upstream's answer also teaches the proxy where each physical partition's leader is. A virtual topic the
client may auto-create is created here with its P partitions (upstream auto-creation would use its own default).
A virtual topic whose upstream partition count is not its P is refused (INVALID_PARTITIONS): its records would
land in the wrong places.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import nested, replace
from kafscale.proxy.handlers.create_topics import UpstreamRefused, create_upstream
from kafscale.proxy.state import Call
from kafscale.proxy.topics import offsets_topic_of

API_KEY, MIN_VERSION, MAX_VERSION = 3, 1, 12

log = logging.getLogger(__name__)


async def handle(call: Call, request: Any) -> Any:
    proxy = call.proxy
    wanted = [t.name for t in request.topics] if request.topics is not None else None
    virtual_wanted = [n for n in wanted or () if n and proxy.topics.layout(n) is not None]
    if virtual_wanted and getattr(request, "allow_auto_topic_creation", True):  # v1-v3: implied
        await _create_missing(call, virtual_wanted)
    answer = await call.session.send(request)
    proxy.cluster.learn(answer)
    cls = type(answer)
    broker = nested(cls, "MetadataResponseBroker")(node_id=proxy.node_id, host=proxy.advertised[0],
                                                   port=proxy.advertised[1], rack=None)
    topics = [_topic(call, t) for t in answer.topics if wanted is not None or offsets_topic_of(t.name or "") is None]
    return replace(answer, brokers=(broker,), controller_id=proxy.node_id, topics=tuple(topics))


async def _create_missing(call: Call, names: list[str]) -> None:
    """Create the virtual topics the upstream lacks, with their P partitions, before the client's request could
    have the upstream auto-create them with its own default count. Asked with the proxy's own request, which
    never auto-creates; a refusal leaves the topic unknown, as the client's answer then says."""
    names = [n for n in names if n not in call.proxy.cluster.partition_counts]  # known to exist: nothing to ask
    if not names:
        return
    await call.session.refresh(names)
    missing = [n for n in names if n not in call.proxy.cluster.partition_counts]
    if missing:
        try:
            await create_upstream(call, [(n, call.proxy.topics.layout(n)) for n in missing])  # type: ignore[misc]
        except UpstreamRefused as e:
            log.warning("%s", e)


def _topic(call: Call, topic: Any) -> Any:
    node = call.proxy.node_id
    partitions = [replace(p, leader_id=node if p.leader_id >= 0 else -1, replica_nodes=(node,), isr_nodes=(node,),
                          offline_replicas=()) for p in topic.partitions]
    layout = call.proxy.topics.layout(topic.name) if topic.name and topic.error_code == 0 else None
    if layout is None:
        return replace(topic, partitions=tuple(partitions))
    if len(partitions) != layout.physical:
        log.warning("topic %s has %d partitions upstream where its mapping says %d physical partitions: refused",
                    topic.name, len(partitions), layout.physical)
        return replace(topic, error_code=ErrorCode.invalid_partitions, partitions=())
    by_index = {p.partition_index: p for p in partitions}
    virtual = [replace(by_index[v % layout.physical], partition_index=v) for v in range(layout.virtual)]
    return replace(topic, partitions=tuple(virtual))
