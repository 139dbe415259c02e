"""InitProducerId v0-v4: durable producer ids for idempotent producers (no transactions)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kafscale.cluster import keys
from kafscale.server.handlers.common import NO_THROTTLE, make, response_module
from kafscale.server.router import RequestContext, Router
from kafscale.storage.metadata_store import Compare, Put

if TYPE_CHECKING:
    from kafscale.broker.shard import ShardCore

API_KEY, MIN_VERSION, MAX_VERSION = 22, 0, 4
MAX_EPOCH = 32767


async def allocate_producer_id(shard: ShardCore) -> int:
    """A new id from a counter in the metadata store (compare-and-swap, so ids are never reused)."""
    while True:
        kv = await shard.meta.get(keys.PRODUCER_ID_NEXT)
        current = int(kv.value) if kv else 1000
        seen = kv.mod_revision if kv else 0
        result = await shard.meta.txn([Compare(keys.PRODUCER_ID_NEXT, "mod_revision", "==", seen)],
                                      [Put(keys.PRODUCER_ID_NEXT, current + 1)])
        if result.succeeded:
            return current


def register(router: Router, shard: ShardCore) -> None:
    async def handle(ctx: RequestContext, req: Any) -> Any:
        mod = response_module(ctx)

        def answer(code: ErrorCode, pid: int = -1, epoch: int = -1) -> Any:
            return make(mod.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=code,
                        producer_id=pid, producer_epoch=epoch)

        if req.transactional_id is not None:
            return answer(ErrorCode.transactional_id_authorization_failed)
        pid = int(getattr(req, "producer_id", -1))
        epoch = int(getattr(req, "producer_epoch", -1))
        if pid >= 0 and 0 <= epoch < MAX_EPOCH:
            # KIP-360: an idempotent producer may bump its own epoch to recover from a sequence error.
            return answer(ErrorCode.none, pid, epoch + 1)
        try:
            return answer(ErrorCode.none, await allocate_producer_id(shard), 0)
        except Exception:
            return answer(ErrorCode.coordinator_not_available)

    router.register(API_KEY, MIN_VERSION, MAX_VERSION, handle)
