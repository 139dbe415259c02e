"""DescribeTransactions v0: the state of transactional ids this shard coordinates (NOT_COORDINATOR for others,
as Kafka answers for an id whose __transaction_state partition it does not lead; the admin client asks
FindCoordinator and goes there). Per id, as TransactionCoordinator.handleDescribeTransactions: DESCRIBE on the
TRANSACTIONAL_ID or TRANSACTIONAL_ID_AUTHORIZATION_FAILED; an unknown id is TRANSACTIONAL_ID_NOT_FOUND; else the
state by Kafka's name (Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort), the producer
id and epoch, the timeout, the start time of the last transaction (-1: none since InitProducerId) and the
partitions of the open one.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module, to_datetime
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType
from kafscale.transactions.state import TxnMetadata, TxnState

API_KEY, MIN_VERSION, MAX_VERSION = 65, 0, 0


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    states = []
    for tid in req.transactional_ids:
        if not allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid):
            states.append(_error(mod, tid, ErrorCode.transactional_id_authorization_failed))
            continue
        error, meta = await broker.transactions.describe(tid)
        if error == ErrorCode.none and (meta is None or meta.state is TxnState.DEAD):
            error = ErrorCode.transactional_id_not_found
        states.append(_error(mod, tid, error) if error != ErrorCode.none or meta is None else _state(mod, meta))
    return make(mod.DescribeTransactionsResponse, throttle_time=NO_THROTTLE, transaction_states=tuple(states))


def _state(mod: Any, meta: TxnMetadata) -> Any:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(meta.partitions):
        by_topic.setdefault(topic, []).append(partition)
    return make(mod.TransactionState, error_code=ErrorCode.none, transactional_id=meta.transactional_id,
                transaction_state=meta.state.value,
                transaction_timeout=datetime.timedelta(milliseconds=meta.timeout_ms),
                transaction_start_time=to_datetime(meta.start_ms), producer_id=meta.producer_id,
                producer_epoch=meta.producer_epoch,
                topics=tuple(make(mod.TopicData, topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()))


def _error(mod: Any, tid: str, error: ErrorCode) -> Any:
    """Kafka's answer for an id it does not describe: the error and the schema's defaults (zeros)."""
    return make(mod.TransactionState, error_code=error, transactional_id=tid, transaction_state="",
                transaction_timeout=datetime.timedelta(0), transaction_start_time=to_datetime(0), producer_id=0,
                producer_epoch=0, topics=())
