"""EndTxn v0-v5: commit or abort the producer's transaction. Answered once the markers are durable in every
partition of the transaction and the groups' offsets are settled (kafscale.transactions; docs/transactions.md).

v5 is transactions v2 (KIP-890 part 2): the ending bumps the producer's epoch, and the answer carries the producer
id and epoch the producer goes on with."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType
from kafscale.transactions.coordinator import EndResult

API_KEY, MIN_VERSION, MAX_VERSION = 26, 0, 5
PRODUCER_FENCED_SINCE = 2  # older versions are told INVALID_PRODUCER_EPOCH instead, as Kafka does
V2_SINCE = 5


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    if not allowed(broker, ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id):
        result = EndResult(ErrorCode.transactional_id_authorization_failed)
    else:
        result = await broker.transactions.end_txn(req.transactional_id, int(req.producer_id),
                                                   int(req.producer_epoch), bool(req.committed),
                                                   v2=ctx.api_version >= V2_SINCE)
    code = result.error
    if code == ErrorCode.producer_fenced and ctx.api_version < PRODUCER_FENCED_SINCE:
        code = ErrorCode.invalid_producer_epoch
    return make(mod.EndTxnResponse, throttle_time=NO_THROTTLE, error_code=code, producer_id=result.producer_id,
                producer_epoch=result.producer_epoch)
