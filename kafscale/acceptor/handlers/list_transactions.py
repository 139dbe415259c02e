"""ListTransactions v0-v1: the transactional ids this shard coordinates, with their producer ids and states.

Kafka's admin client sends ListTransactions to every broker and merges the answers (ListTransactionsHandler,
AllBrokersStrategy), and each broker answers for the __transaction_state partitions it leads. Metadata lists
every shard as a broker, so each shard answers for the ids it coordinates (kafscale.transactions.registry):
answering for the whole cluster would list each id once per shard. Filters as Kafka's
(TransactionStateManager.listTransactionStates): states (by Kafka's exact names; unknown ones are echoed in
`unknown_state_filters` and match nothing), producer ids, and v1's duration (only transactions that started more
than that long ago). Ids the principal may not DESCRIBE are left out, as Kafka does.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType
from kafscale.transactions.coordinator import now_ms
from kafscale.transactions.state import TxnState

API_KEY, MIN_VERSION, MAX_VERSION = 66, 0, 1
KNOWN_STATES = {s.value: s for s in TxnState}


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    wanted = list(req.state_filters)
    unknown = tuple(s for s in wanted if s not in KNOWN_STATES)
    states = {KNOWN_STATES[s] for s in wanted if s in KNOWN_STATES}
    producer_ids = {int(p) for p in req.producer_id_filters}
    duration = int(getattr(req, "duration_filter", -1))  # v1+
    listed = [] if broker.transactions.closed else await broker.transactions.transactions()
    now = now_ms()
    found = tuple(
        make(mod.TransactionState, transactional_id=m.transactional_id, producer_id=m.producer_id,
             transaction_state=m.state.value)
        for m in sorted(listed, key=lambda m: m.transactional_id)
        if m.state is not TxnState.DEAD
        and (not producer_ids or m.producer_id in producer_ids)
        and (not wanted or m.state in states)
        and (duration < 0 or now - m.start_ms > duration)
        and allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, m.transactional_id))
    return make(mod.ListTransactionsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                unknown_state_filters=unknown, transaction_states=found)
