"""FindCoordinator v0-v5: names the shard that hosts a group, or a transactional id's transaction coordinator
(key type 1): the same slots decide both (kafscale.cluster.placement; docs/transactions.md). v5 is v4 with
TRANSACTION_ABORTABLE among the errors, which is never answered here."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 10, 0, 5
KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION = 0, 1


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    key_type = int(getattr(req, "key_type", KEY_TYPE_GROUP))

    def locate(key: str) -> tuple[ErrorCode, Any]:
        if key_type == KEY_TYPE_GROUP:
            if not allowed(broker, ctx, Operation.DESCRIBE, ResourceType.GROUP, key):
                return ErrorCode.group_authorization_failed, None
        elif key_type == KEY_TYPE_TRANSACTION:
            if not allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
                return ErrorCode.transactional_id_authorization_failed, None
        else:
            return ErrorCode.invalid_request, None
        shard = broker.placement.address(broker.placement.coordinator_of(key))
        if shard is None:  # its shard is gone: the controller is moving the group's slot
            return ErrorCode.coordinator_not_available, None
        return ErrorCode.none, shard

    if ctx.api_version >= 4:
        coordinators = []
        for key in req.coordinator_keys:
            code, s = locate(key)
            host, port = s.on(ctx.listener.name) if s else ("", -1)
            coordinators.append(make(mod.Coordinator, key=key, node_id=s.id if s else -1, host=host, port=port,
                                     error_code=code, error_message=None))
        return make(mod.FindCoordinatorResponse, throttle_time=NO_THROTTLE, coordinators=tuple(coordinators))
    code, s = locate(req.key)
    host, port = s.on(ctx.listener.name) if s else ("", -1)
    return make(mod.FindCoordinatorResponse, throttle_time=NO_THROTTLE, error_code=code, error_message=None,
                node_id=s.id if s else -1, host=host, port=port)
