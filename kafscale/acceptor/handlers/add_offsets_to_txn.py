"""AddOffsetsToTxn v0-v4: a group's offsets become part of the producer's transaction (the producer then sends
TxnOffsetCommit to the group's coordinator; EndTxn makes them committed or drops them; docs/transactions.md)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 25, 0, 4
PRODUCER_FENCED_SINCE = 2  # older versions are told INVALID_PRODUCER_EPOCH instead, as Kafka does


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    if not allowed(broker, ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id):
        code = ErrorCode.transactional_id_authorization_failed
    elif not allowed(broker, ctx, Operation.READ, ResourceType.GROUP, req.group_id):
        code = ErrorCode.group_authorization_failed
    else:
        code = await broker.transactions.add_offsets(req.transactional_id, int(req.producer_id),
                                                     int(req.producer_epoch), req.group_id)
    if code == ErrorCode.producer_fenced and ctx.api_version < PRODUCER_FENCED_SINCE:
        code = ErrorCode.invalid_producer_epoch
    return make(mod.AddOffsetsToTxnResponse, throttle_time=NO_THROTTLE, error_code=code)
