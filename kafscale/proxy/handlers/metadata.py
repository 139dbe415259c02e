"""Metadata: the proxy is the one broker, leading every partition; a virtual topic shows V partitions.

The upstream's answer also teaches the proxy where each physical partition's leader is. Virtual topics are asked
of the upstream with the proxy's own request, which never auto-creates: a virtual topic the client may
auto-create is created here with its P partitions, where upstream auto-creation would use its own default count
(and Metadata v1-v3 cannot say "don't"). Their entries are then given in the client's version. A virtual topic
whose upstream partition count is not its P is refused (INVALID_PARTITIONS): its records would land in the wrong
places.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import convert, make, nested, replace, response_class
from kafscale.proxy.handlers.create_topics import UpstreamRefused, create_upstream
from kafscale.proxy.state import Call
from kafscale.proxy.topics import offsets_topic_of

API_KEY, MIN_VERSION, MAX_VERSION = 3, 1, 12
AUTO_CREATE_FLAG = 4  # the first version with allow_auto_topic_creation

log = logging.getLogger(__name__)


async def handle(call: Call, request: Any) -> Any:
    proxy = call.proxy
    entries = list(request.topics) if request.topics is not None else None
    virtual = [t.name for t in entries or () if t.name and proxy.topics.layout(t.name) is not None]
    if entries is None or not virtual:
        answer = await call.session.send(request)  # all topics, or plain ones only: as the client asked
    else:
        answer = await _with_virtual(call, request, virtual)
    proxy.cluster.learn(answer)
    cls = type(answer)
    broker = nested(cls, "MetadataResponseBroker")(node_id=proxy.node_id, host=proxy.advertised[0],
                                                   port=proxy.advertised[1], rack=None)
    topics = [_topic(call, t) for t in answer.topics if entries is not None or offsets_topic_of(t.name or "") is None]
    return replace(answer, brokers=(broker,), controller_id=proxy.node_id, topics=tuple(topics))


async def _with_virtual(call: Call, request: Any, virtual: list[str]) -> Any:
    """The answer to a request naming virtual topics, in the client's version: those asked with the proxy's own
    request (created first if missing and the client allows it), the others forwarded as the client asked."""
    version = max(request.__version__, AUTO_CREATE_FLAG)  # the client's, unless too old to say "don't create"
    own = await call.session.refresh(virtual, version)
    there = {t.name for t in own.topics if t.error_code != ErrorCode.unknown_topic_or_partition}
    missing = [n for n in virtual if n not in there]
    if missing and getattr(request, "allow_auto_topic_creation", True):  # v1-v3: implied
        try:
            await create_upstream(call, missing)
        except UpstreamRefused as e:
            log.warning("%s", e)
        own = await call.session.refresh(virtual, version)
    plain = tuple(t for t in request.topics if t.name not in virtual)
    response = response_class(API_KEY, request.__version__)
    if plain:
        base = await call.session.send(replace(request, topics=plain))
    else:
        base = make(response, throttle_time=0, brokers=own.brokers, cluster_id=own.cluster_id,
                    controller_id=own.controller_id, topics=())
    topic_cls, part_cls = nested(response, "MetadataResponseTopic"), nested(response, "MetadataResponsePartition")
    found = {t.name: t for t in base.topics}
    found.update({t.name: convert(t, topic_cls, partitions=tuple(convert(p, part_cls) for p in t.partitions))
                  for t in own.topics})
    return replace(base, topics=tuple(found[t.name] for t in request.topics if t.name in found))


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
