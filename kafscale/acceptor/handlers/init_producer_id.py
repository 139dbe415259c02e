"""InitProducerId v0-v4: durable producer ids for idempotent producers (no transactions)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed_on_cluster, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 22, 0, 4
MAX_EPOCH = 32767


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)

    def answer(code: ErrorCode, pid: int = -1, epoch: int = -1) -> Any:
        return make(mod.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=code,
                    producer_id=pid, producer_epoch=epoch)

    if req.transactional_id is not None:
        return answer(ErrorCode.transactional_id_authorization_failed)
    authorizer = broker.acls.authorizer
    if authorizer is not None and not (
            allowed_on_cluster(broker, ctx, Operation.IDEMPOTENT_WRITE)
            or authorizer.allows_any(str(ctx.principal), ctx.client_host, Operation.WRITE, ResourceType.TOPIC)):
        return answer(ErrorCode.cluster_authorization_failed)
    pid = int(getattr(req, "producer_id", -1))
    epoch = int(getattr(req, "producer_epoch", -1))
    if pid >= 0 and 0 <= epoch < MAX_EPOCH:
        # KIP-360: an idempotent producer may bump its own epoch to recover from a sequence error.
        return answer(ErrorCode.none, pid, epoch + 1)
    try:
        return answer(ErrorCode.none, await broker.allocate_producer_id(), 0)
    except Exception:
        return answer(ErrorCode.coordinator_not_available)
