"""Schemas of versions newer than kio 0.6.2 has, written from Kafka's message specs (clients/src/main/resources/
common/message/*.json), one module per API version, in kio's form so that kio's reader and writer, the guard and
the handlers use them as they use kio's own.

kio is pinned at 0.6.2 because later releases dropped the versions Kafka 4 removed, which old clients still send
(docs/compatibility.md). The versions here are those transactions v2 (KIP-890 part 2) and the regular expression
subscriptions of the consumer group protocol (KIP-848) need. Each is its predecessor with at most a few fields added
(FindCoordinator v5 only has one more error code clients expect), so each module subclasses kio's previous version
(or, where a field is added in the middle, writes the class out) and re-exports its nested classes: handlers look
nested classes up by name in the module of the top-level class. Like kio's, the modules do without
`from __future__ import annotations`, since kio reads the field types at run time.
"""

from __future__ import annotations

from types import ModuleType

from kafscale.protocol.newer import (
    consumer_group_heartbeat_v1,
    end_txn_v5,
    find_coordinator_v5,
    produce_v12,
    txn_offset_commit_v5,
)

# (api_key, version) -> the module holding that version's request and response classes
MODULES: dict[tuple[int, int], ModuleType] = {
    (0, 12): produce_v12,
    (10, 5): find_coordinator_v5,
    (26, 5): end_txn_v5,
    (28, 5): txn_offset_commit_v5,
    (68, 1): consumer_group_heartbeat_v1,
}


def request_class(api_key: int, version: int) -> type | None:
    module = MODULES.get((api_key, version))
    return module.REQUEST if module is not None else None


def response_class(api_key: int, version: int) -> type | None:
    module = MODULES.get((api_key, version))
    return module.RESPONSE if module is not None else None
