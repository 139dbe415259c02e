"""Every API a shard serves, and the router that dispatches to them (ApiVersions advertises exactly these).

A handler module is named after its API and exports API_KEY, MIN_VERSION, MAX_VERSION and
`handle(broker, ctx, request)`; one that reads its requests itself (Produce) exports DECODE too.
ApiVersions is the router's own (kafscale.acceptor.handlers.api_versions).
"""

from __future__ import annotations

import asyncio
import functools
from types import ModuleType

from kafscale.acceptor.handlers import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    alter_configs,
    alter_user_scram_credentials,
    consumer_group_describe,
    consumer_group_heartbeat,
    create_acls,
    create_partitions,
    create_topics,
    delete_acls,
    delete_groups,
    delete_records,
    delete_topics,
    describe_acls,
    describe_client_quotas,
    describe_cluster,
    describe_configs,
    describe_groups,
    describe_log_dirs,
    describe_producers,
    describe_transactions,
    describe_user_scram_credentials,
    end_txn,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    list_transactions,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    offset_for_leader_epoch,
    produce,
    sasl_authenticate,
    sasl_handshake,
    sync_group,
    txn_offset_commit,
    write_txn_markers,
)
from kafscale.acceptor.handlers.api_versions import GROUP_VERSION, TRANSACTION_VERSION
from kafscale.acceptor.router import Router
from kafscale.broker.interface import Broker
from kafscale.protocol.codec import decode_request, request_class, response_class

# Authentication (docs/security.md): answered on every listener, as Kafka does.
HANDLERS: tuple[ModuleType, ...] = (sasl_handshake, sasl_authenticate, describe_user_scram_credentials,
                                    alter_user_scram_credentials, describe_acls, create_acls, delete_acls)
# Data and topics.
HANDLERS += (produce, fetch, list_offsets, metadata, create_topics, delete_topics,
                                    init_producer_id, find_coordinator)
# Operations (docs/operations.md): admin APIs.
HANDLERS += (create_partitions, describe_configs, alter_configs, incremental_alter_configs, offset_for_leader_epoch,
             describe_cluster, delete_records, describe_client_quotas, describe_log_dirs)
# Consumer groups (docs/groups.md).
HANDLERS += (join_group, sync_group, heartbeat, leave_group, offset_commit, offset_fetch, offset_delete,
             describe_groups, list_groups, delete_groups, txn_offset_commit, consumer_group_heartbeat,
             consumer_group_describe)
# Transactions (docs/transactions.md): InitProducerId and FindCoordinator are above.
HANDLERS += (add_partitions_to_txn, add_offsets_to_txn, end_txn, list_transactions, describe_transactions,
             describe_producers, write_txn_markers)


# What every client sends in its first seconds (connect, look up, produce or consume in a group), in the newest
# versions, which today's clients use. The router loads schema classes on first use; these load once the shard
# listens, a version at a time between the loop's other work, so that a client's first requests do not wait the
# few milliseconds a version's modules take (every version of them would cost a shard start ~1 s of CPU).
NEWEST_WARMED = 3
HOT = (metadata, produce, fetch, list_offsets, find_coordinator, init_producer_id, join_group, sync_group, heartbeat,
       offset_commit, offset_fetch, leave_group)


async def warm_hot_schemas() -> None:
    for module in HOT:
        for version in range(max(module.MIN_VERSION, module.MAX_VERSION - NEWEST_WARMED + 1), module.MAX_VERSION + 1):
            request_class(module.API_KEY, version)
            response_class(module.API_KEY, version)
            await asyncio.sleep(0)


def build_router(broker: Broker) -> Router:
    router = Router({TRANSACTION_VERSION: broker.config.transaction_version, GROUP_VERSION: 1})
    for module in HANDLERS:
        router.register(module.API_KEY, module.MIN_VERSION, module.MAX_VERSION,
                        functools.partial(module.handle, broker), decode=getattr(module, "DECODE", decode_request))
    return router
