"""WriteTxnMarkers v0-v1: transaction markers written into partitions on request.

In Kafka a transaction coordinator sends these to partition leaders; here coordinators write their markers
through the shards' own calls (kafscale.broker.txn_markers), so this API is served for Kafka's admin client:
Admin.abortTransaction (`kafka-transactions.sh abort`) ends a hanging transaction, one whose coordinator will
never write its marker, by sending an ABORT marker to the partition's leader. Each marker goes to the
partition's owner and is durable before the answer, as Kafka appends with acks=all. CLUSTER_ACTION on the
cluster, as Kafka requires, or every partition is CLUSTER_AUTHORIZATION_FAILED. Per partition: an unknown one is
UNKNOWN_TOPIC_OR_PARTITION; a marker with an older producer epoch than the partition holds INVALID_PRODUCER_EPOCH.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import allowed_on_cluster, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation
from kafscale.storage.control import TxnMarker

API_KEY, MIN_VERSION, MAX_VERSION = 27, 0, 1
TIMEOUT_MS = 30_000  # Kafka appends a coordinator's markers within request.timeout.ms (30 s by default)


async def _refused(error: ErrorCode) -> int:
    return int(error)


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    may = allowed_on_cluster(broker, ctx, Operation.CLUSTER_ACTION)
    jobs = []
    for m in req.markers:
        marker = TxnMarker(int(m.producer_id), int(m.producer_epoch), int(m.coordinator_epoch),
                           bool(m.transaction_result))
        jobs += [broker.write_txn_marker(t.name, int(p), marker, TIMEOUT_MS) if may
                 else _refused(ErrorCode.cluster_authorization_failed)
                 for t in m.topics for p in t.partition_indexes]
    results = iter(await asyncio.gather(*jobs))
    markers = tuple(
        make(mod.WritableTxnMarkerResult, producer_id=m.producer_id, topics=tuple(
            make(mod.WritableTxnMarkerTopicResult, name=t.name, partitions=tuple(
                make(mod.WritableTxnMarkerPartitionResult, partition_index=p, error_code=ErrorCode(next(results)))
                for p in t.partition_indexes))
            for t in m.topics))
        for m in req.markers)
    return make(mod.WriteTxnMarkersResponse, markers=markers)
