"""InitProducerId v0-v5: producer ids for idempotent producers, and for transactional ones through their
transaction coordinator (kafscale.transactions: bumps the epoch, aborts a transaction the previous producer
left open, fences older producers; docs/transactions.md)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, allowed_on_cluster, make, ms, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 22, 0, 5
MAX_EPOCH = 32767
PRODUCER_FENCED_SINCE = 4  # older versions are told INVALID_PRODUCER_EPOCH instead, as Kafka does


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)

    def answer(code: ErrorCode, pid: int = -1, epoch: int = -1) -> Any:
        return make(mod.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=code,
                    producer_id=pid, producer_epoch=epoch)

    pid = int(getattr(req, "producer_id", -1))
    epoch = int(getattr(req, "producer_epoch", -1))
    if req.transactional_id is not None:
        return await _transactional(broker, ctx, req, pid, epoch, answer)
    authorizer = broker.acls.authorizer
    if authorizer is not None and not (
            allowed_on_cluster(broker, ctx, Operation.IDEMPOTENT_WRITE)
            or authorizer.allows_any(str(ctx.principal), ctx.client_host, Operation.WRITE, ResourceType.TOPIC)):
        return answer(ErrorCode.cluster_authorization_failed)
    if pid >= 0 and 0 <= epoch < MAX_EPOCH:
        # KIP-360: an idempotent producer may bump its own epoch to recover from a sequence error.
        return answer(ErrorCode.none, pid, epoch + 1)
    try:
        return answer(ErrorCode.none, await broker.allocate_producer_id(), 0)
    except Exception:
        return answer(ErrorCode.coordinator_not_available)


async def _transactional(broker: Broker, ctx: RequestContext, req: Any, pid: int, epoch: int, answer: Any) -> Any:
    tid = str(req.transactional_id)
    if not allowed(broker, ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
        return answer(ErrorCode.transactional_id_authorization_failed)
    result = await broker.transactions.init_producer_id(tid, ms(req.transaction_timeout), pid, epoch)
    code = result.error
    if code == ErrorCode.producer_fenced and ctx.api_version < PRODUCER_FENCED_SINCE:
        code = ErrorCode.invalid_producer_epoch
    return answer(code, result.producer_id, result.producer_epoch)
