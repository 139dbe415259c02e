"""DeleteTopics and DescribeConfigs, passed to the upstream; deleting a virtual topic deletes its committed
offsets' companion topic too."""

from __future__ import annotations

from typing import Any

from kafscale.protocol.codec import replace
from kafscale.proxy.state import Call
from kafscale.proxy.topics import offsets_topic

DELETE_TOPICS, DESCRIBE_CONFIGS = 20, 32
VERSIONS = {DELETE_TOPICS: (1, 5), DESCRIBE_CONFIGS: (0, 4)}


async def handle(call: Call, request: Any) -> Any:
    if request.__api_key__ != DELETE_TOPICS:
        return await call.session.send(request)
    answer = await call.session.send(request)
    deleted = [r.name for r in answer.responses if r.error_code == 0 and call.proxy.topics.layout(r.name)]
    if deleted:  # v1-v5 name topics by name only
        await call.session.send(replace(request, topic_names=tuple(offsets_topic(n) for n in deleted)))
        for name in deleted:
            call.proxy.topics.offsets_ready.discard(name)
            call.proxy.cluster.partition_counts.pop(name, None)
    return answer
