"""DescribeCluster v0-v1: every shard is a broker; the controller id is 0, as Metadata says. Asked for them, the
cluster operations the principal may do, as Kafka's bit set (bit n: AclOperation n)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import (
    NO_THROTTLE,
    OPERATIONS_NOT_REQUESTED,
    allowed_on_cluster,
    authorized_operations,
    make,
    response_module,
)
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import CLUSTER_NAME, Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 60, 0, 1
ENDPOINT_BROKERS = 1
AUTHORIZED_OPERATIONS_OMITTED = OPERATIONS_NOT_REQUESTED


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    endpoint_type = int(getattr(req, "endpoint_type", ENDPOINT_BROKERS))
    if endpoint_type != ENDPOINT_BROKERS:
        # Kafka brokers answer this for controller endpoints (only KRaft controllers list those).
        return make(mod.DescribeClusterResponse, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.unsupported_endpoint_type,
                    error_message="only broker endpoints are served", endpoint_type=endpoint_type,
                    cluster_id=broker.cluster_id, controller_id=-1, brokers=(),
                    cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)
    if not allowed_on_cluster(broker, ctx, Operation.DESCRIBE):
        return make(mod.DescribeClusterResponse, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.cluster_authorization_failed, error_message=None,
                    endpoint_type=endpoint_type, cluster_id=broker.cluster_id, controller_id=-1, brokers=(),
                    cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)
    brokers = tuple(make(mod.DescribeClusterBroker, broker_id=s.id, host=host, port=port, rack=None)
                    for s in broker.placement.shards for host, port in (s.on(ctx.listener.name),))
    wanted = bool(getattr(req, "include_cluster_authorized_operations", False))
    operations = authorized_operations(broker, ctx, ResourceType.CLUSTER, CLUSTER_NAME) if wanted \
        else AUTHORIZED_OPERATIONS_OMITTED
    return make(mod.DescribeClusterResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                error_message=None, endpoint_type=ENDPOINT_BROKERS, cluster_id=broker.cluster_id,
                controller_id=0, brokers=brokers, cluster_authorized_operations=operations)
