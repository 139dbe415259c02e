"""What every API handler shares: the response classes of the request's version, time conversions."""

from __future__ import annotations

import datetime
import functools
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from kafscale.acceptor.router import RequestContext
from kafscale.protocol.codec import make, response_class
from kafscale.security.acl import CLUSTER_NAME, Operation, ResourceType

if TYPE_CHECKING:
    from kafscale.broker.interface import Broker
    from kafscale.cluster.placement import ShardAddress

__all__ = ["NO_THROTTLE", "allowed", "from_datetime", "make", "ms", "response_module", "to_datetime"]

NO_THROTTLE = datetime.timedelta(0)


@functools.cache
def _module(api_key: int, version: int) -> ModuleType:
    return sys.modules[response_class(api_key, version).__module__]


def response_module(ctx: RequestContext) -> ModuleType:
    """The kio module of this request's response version (its nested classes differ per version)."""
    return _module(ctx.api_key, ctx.api_version)


def ms(value: datetime.timedelta | int | None, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


def to_datetime(timestamp_ms: int) -> datetime.datetime | None:
    if timestamp_ms < 0:
        return None
    return datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)


def from_datetime(value: datetime.datetime | int | None) -> int:
    if value is None:
        return -1
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def new_leader(broker: Broker, topic: str, partition: int) -> tuple[int, int, ShardAddress] | None:
    """For a NOT_LEADER_OR_FOLLOWER answer: the partition's leader as placement names it (id, leader epoch,
    address), so that Produce v10+ and Fetch v16+ can name it (KIP-951) and the client goes there without a
    metadata refresh. None when there is none to name (not live, or this shard itself)."""
    info = broker.topics.topics.get(topic)
    if info is None or not 0 <= partition < info.partitions:
        return None
    leader = broker.placement.leader_of(info, partition)
    address = broker.placement.address(leader)
    if leader == broker.shard_id or address is None:
        return None
    return leader, broker.placement.leader_epoch(info, partition), address


def allowed(broker: Broker, ctx: RequestContext, operation: Operation, resource_type: ResourceType, name: str) -> bool:
    """May the request's principal, from its host, do this (docs/security.md, "Authorization")? Always, while no
    authorizer is configured."""
    authorizer = broker.acls.authorizer
    return authorizer is None or authorizer.allows(str(ctx.principal), ctx.client_host, operation, resource_type,
                                                   name)


def allowed_on_cluster(broker: Broker, ctx: RequestContext, operation: Operation) -> bool:
    return allowed(broker, ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME)


# Kafka's "authorized operations" (KIP-430): a bit set, bit n for AclOperation n the principal may do on a
# resource; this value when the client did not ask. The operations an ACL can grant on each resource type are
# Kafka's AclEntry.supportedOperations.
OPERATIONS_NOT_REQUESTED = -(2**31)
SUPPORTED_OPERATIONS = {
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                           Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE),
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE, Operation.DELETE,
                         Operation.ALTER, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
}


def authorized_operations(broker: Broker, ctx: RequestContext, resource_type: ResourceType, name: str) -> int:
    return sum(1 << op for op in SUPPORTED_OPERATIONS[resource_type]
               if allowed(broker, ctx, op, resource_type, name))
