"""CreateTopics: a virtual topic is created upstream with its P partitions, and its companion topic of committed
offsets with V. A count other than P or V (or -1, the default) for a virtual topic is refused: the mapping
decides its layout."""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import make, nested, replace, request_class
from kafscale.proxy.state import Call
from kafscale.proxy.topics import MAX_TOPIC_NAME, offsets_topic
from kafscale.proxy.upstream import CREATE_TOPICS_VERSION

API_KEY, MIN_VERSION, MAX_VERSION = 19, 2, 7
log = logging.getLogger(__name__)


async def handle(call: Call, request: Any) -> Any:
    refused: dict[str, str] = {}
    topics = []
    for topic in request.topics:
        layout = call.proxy.topics.layout(topic.name)
        if layout is None:
            topics.append(topic)
        elif topic.num_partitions not in (-1, layout.physical, layout.virtual):
            refused[topic.name] = (f"topic {topic.name} has {layout.virtual} virtual partitions over "
                                   f"{layout.physical} by the proxy's mapping; asked for {topic.num_partitions}")
        elif len(offsets_topic(topic.name)) > MAX_TOPIC_NAME:
            refused[topic.name] = f"topic name {topic.name} is too long for its committed-offsets topic"
        else:
            topics.append(replace(topic, num_partitions=layout.physical))
    answer = await call.session.send(replace(request, topics=tuple(topics)))
    created = [t.name for t in answer.topics if t.error_code == 0 and call.proxy.topics.layout(t.name) is not None]
    if created and not request.validate_only:
        try:
            await create_upstream(call, created, companions_only=True)
        except UpstreamRefused as e:  # the topics are there; the companions are tried again at the first commit
            log.warning("%s", e)
    result_cls = nested(type(answer), "CreatableTopicResult")
    results = [_virtual_result(call, t) for t in answer.topics]
    results += [make(result_cls, name=name, topic_id=None, error_code=ErrorCode.invalid_partitions,
                     error_message=message, topic_config_error_code=0, num_partitions=-1, replication_factor=-1,
                     configs=None) for name, message in refused.items()]
    return replace(answer, topics=tuple(results))


def _virtual_result(call: Call, result: Any) -> Any:
    layout = call.proxy.topics.layout(result.name)
    if layout is None or result.error_code != 0 or not hasattr(result, "num_partitions"):
        return result
    return replace(result, num_partitions=layout.virtual)


async def create_upstream(call: Call, names: list[str], *, companions_only: bool = False) -> None:
    """Create virtual topics upstream (P partitions each) with their committed-offsets topics (V), or only the
    companions of topics that exist; a topic that exists already is fine."""
    wanted = []
    for name in names:
        layout = call.proxy.topics.layout(name)
        assert layout is not None, name
        if not companions_only:
            wanted.append((name, layout.physical))
        wanted.append((offsets_topic(name), layout.virtual))
    if not wanted:
        return
    await call.session.versions()
    cls = request_class(19, call.proxy.cluster.version(19, CREATE_TOPICS_VERSION))
    topic_cls = nested(cls, "CreatableTopic")
    request = make(cls, topics=tuple(make(topic_cls, name=name, num_partitions=count, replication_factor=-1,
                                          assignments=(), configs=()) for name, count in wanted),
                   timeout=30_000, validate_only=False)
    answer = await call.session.send(request)
    for result in answer.topics:
        if result.error_code not in (ErrorCode.none, ErrorCode.topic_already_exists):
            raise UpstreamRefused(f"upstream refused to create {result.name}: {result.error_code!r} "
                                  f"{getattr(result, 'error_message', '') or ''}", ErrorCode(result.error_code))
    call.proxy.topics.offsets_ready.update(names)


class UpstreamRefused(Exception):
    """The upstream would not create a topic the proxy needs; `error_code` is its answer."""

    def __init__(self, message: str, error_code: ErrorCode) -> None:
        super().__init__(message)
        self.error_code = error_code
