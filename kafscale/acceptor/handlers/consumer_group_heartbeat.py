"""ConsumerGroupHeartbeat v0-v1 (KIP-848): join, heartbeat and leave a consumer-protocol group in one API.

Topic ids become names here, and back: the group (kafscale/groups/consumer/group.py) works with the names of the
topics that exist now, so a regex subscription matches them and a deleted topic's partitions are dropped.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, ms, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.cluster.topics import TopicInfo
from kafscale.groups.consumer.assignors import Assignment
from kafscale.groups.consumer.group import Heartbeat, HeartbeatAnswer
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 68, 0, 1


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    answer = await _heartbeat(broker, ctx, req)
    mod = response_module(ctx)
    assignment = None
    if answer.error == ErrorCode.none and answer.assignment is not None:
        known = broker.topics.topics
        assignment = make(mod.Assignment, topic_partitions=tuple(
            make(mod.TopicPartitions, topic_id=known[t].id, partitions=tuple(sorted(ps)))
            for t, ps in sorted(answer.assignment.items()) if t in known and ps))
    return make(mod.ConsumerGroupHeartbeatResponse, throttle_time=NO_THROTTLE, error_code=answer.error,
                error_message=answer.message, member_id=answer.member_id, member_epoch=answer.member_epoch,
                heartbeat_interval=datetime.timedelta(milliseconds=answer.heartbeat_interval_ms),
                assignment=assignment)


async def _heartbeat(broker: Broker, ctx: RequestContext, req: Any) -> HeartbeatAnswer:
    if not req.group_id:
        return HeartbeatAnswer(ErrorCode.invalid_request, "GroupId can't be empty.")
    if not allowed(broker, ctx, Operation.READ, ResourceType.GROUP, req.group_id):
        return HeartbeatAnswer(ErrorCode.group_authorization_failed)
    names = req.subscribed_topic_names
    if names is not None:
        # Kafka checks DESCRIBE on each subscribed topic at the heartbeat; unauthorized ones are not assigned.
        names = tuple(n for n in names if allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TOPIC, n))
    error, coordinator = await broker.groups.lookup(req.group_id, create=req.member_epoch == 0)
    if error != ErrorCode.none:
        return HeartbeatAnswer(error)
    if coordinator is None:  # a heartbeat (not a join) to a group that does not exist, as Kafka answers it
        return HeartbeatAnswer(ErrorCode.group_id_not_found, f"Group {req.group_id} not found.")
    topics = PartitionCounts(broker.topics.topics)
    hb = Heartbeat(member_id=req.member_id, member_epoch=req.member_epoch, instance_id=req.instance_id,
                   rack_id=req.rack_id, rebalance_timeout_ms=ms(req.rebalance_timeout, -1),
                   subscribed_names=names, subscribed_regex=getattr(req, "subscribed_topic_regex", None),
                   server_assignor=req.server_assignor, owned=_owned(broker, req.topic_partitions),
                   client_id=ctx.client_id or "", client_host=f"/{ctx.client_host}")
    return await coordinator.consumer_heartbeat(hb, topics, ctx.api_version)


class PartitionCounts(Mapping[str, int]):
    """Every topic's partition count, read through from the topic registry: a heartbeat must not copy the whole
    topic table (there may be 100,000 topics) to look up the few its group subscribes to."""

    def __init__(self, topics: Mapping[str, TopicInfo]) -> None:
        self._topics = topics

    def __getitem__(self, name: str) -> int:
        return self._topics[name].partitions

    def __iter__(self) -> Iterator[str]:
        return iter(self._topics)

    def __len__(self) -> int:
        return len(self._topics)


def _owned(broker: Broker, owned: Any) -> Assignment | None:
    """The partitions the member says it owns, by topic name; those of topics that no longer exist are dropped."""
    if owned is None:
        return None
    by_id: dict[uuid.UUID, Any] = broker.topics.by_id
    return {by_id[tp.topic_id].name: frozenset(int(p) for p in tp.partitions)
            for tp in owned if tp.topic_id in by_id and tp.partitions}
