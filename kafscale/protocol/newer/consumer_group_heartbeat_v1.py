"""ConsumerGroupHeartbeat v1 (ConsumerGroupHeartbeatRequest.json): v0 with SubscribedTopicRegex, the regular
expression subscription of KIP-848, after SubscribedTopicNames. The response is v0's. The request is written out
whole rather than subclassed: the new field sits in the middle, and field order is wire order."""

import datetime
from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.consumer_group_heartbeat.v0 import response as v0_response
from kio.schema.consumer_group_heartbeat.v0.request import TopicPartitions
from kio.schema.consumer_group_heartbeat.v0.response import Assignment
from kio.schema.consumer_group_heartbeat.v0.response import TopicPartitions as AssignedTopicPartitions
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.types import GroupId, TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i32Timedelta

__all__ = ["AssignedTopicPartitions", "Assignment", "ConsumerGroupHeartbeatRequest",
           "ConsumerGroupHeartbeatResponse", "TopicPartitions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupHeartbeatRequest:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(68)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    group_id: GroupId = field(metadata={"kafka_type": "string"})
    member_id: str = field(metadata={"kafka_type": "string"})
    member_epoch: i32 = field(metadata={"kafka_type": "int32"})
    instance_id: str | None = field(metadata={"kafka_type": "string"}, default=None)
    rack_id: str | None = field(metadata={"kafka_type": "string"}, default=None)
    rebalance_timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"},
                                            default=i32Timedelta.parse(datetime.timedelta(milliseconds=-1)))
    subscribed_topic_names: tuple[TopicName, ...] | None = field(metadata={"kafka_type": "string"}, default=None)
    subscribed_topic_regex: str | None = field(metadata={"kafka_type": "string"}, default=None)
    server_assignor: str | None = field(metadata={"kafka_type": "string"}, default=None)
    topic_partitions: tuple[TopicPartitions, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupHeartbeatResponse(v0_response.ConsumerGroupHeartbeatResponse):
    __version__: ClassVar[i16] = i16(1)


REQUEST = ConsumerGroupHeartbeatRequest
RESPONSE = ConsumerGroupHeartbeatResponse
