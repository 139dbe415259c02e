"""ApiVersions against Apache Kafka: the table of API keys and version ranges, side by side.

Kafscale's table must equal the one expected from Kafka 4.4.0's: the same keys but those it intends not to serve
(NOT_SERVED), the same newest versions but where it intends to stop earlier (NEWEST). Each of those is listed in
docs/compatibility.md with its reason, which the case checks. Oldest versions are compared as a range: Kafscale may
serve versions older than 4.4.0's oldest, as long as Kafka 3.9.2 served them (the protocol versions Kafka 4.0
removed, KIP-896, which clients of old still send).
"""

from __future__ import annotations

from pathlib import Path

from kafscale.testing.kafka_reference import ReferenceKafka
from tests.differential.wire import API_VERSIONS, Peer, code, req
from tests.integration.conftest import Cluster

COMPATIBILITY = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"

# Kafka 4.4.0's APIs that Kafscale does not serve, by key: (name, why), as docs/compatibility.md lists them.
KRAFT = "KRaft's own quorum, controllers and feature levels: Kafscale's metadata is etcd or SQLite"
REPLICAS = "there are no replicas or local log directories: partitions live in the object store"
SHARE_GROUPS = "share groups (KIP-932) are not built"
STREAMS_GROUPS = "streams groups (KIP-1071) are not built"
NOT_SERVED: dict[int, tuple[str, str]] = {
    34: ("AlterReplicaLogDirs", REPLICAS), 43: ("ElectLeaders", REPLICAS),
    45: ("AlterPartitionReassignments", REPLICAS), 46: ("ListPartitionReassignments", REPLICAS),
    55: ("DescribeQuorum", KRAFT), 57: ("UpdateFeatures", KRAFT), 64: ("UnregisterBroker", KRAFT),
    80: ("AddRaftVoter", KRAFT), 81: ("RemoveRaftVoter", KRAFT), 94: ("UnregisterController", KRAFT),
    38: ("CreateDelegationToken", "delegation tokens are not built (SASL SCRAM, PLAIN and OAUTHBEARER are)"),
    39: ("RenewDelegationToken", "delegation tokens are not built"),
    40: ("ExpireDelegationToken", "delegation tokens are not built"),
    41: ("DescribeDelegationToken", "delegation tokens are not built"),
    49: ("AlterClientQuotas", "client quotas are not built"),
    74: ("ListConfigResources", "client metrics resources (KIP-714) are not built"),
    75: ("DescribeTopicPartitions", "not built yet: clients fall back to Metadata"),
    76: ("ShareGroupHeartbeat", SHARE_GROUPS), 77: ("ShareGroupDescribe", SHARE_GROUPS),
    78: ("ShareFetch", SHARE_GROUPS), 79: ("ShareAcknowledge", SHARE_GROUPS),
    83: ("InitializeShareGroupState", SHARE_GROUPS), 84: ("ReadShareGroupState", SHARE_GROUPS),
    85: ("WriteShareGroupState", SHARE_GROUPS), 86: ("DeleteShareGroupState", SHARE_GROUPS),
    87: ("ReadShareGroupStateSummary", SHARE_GROUPS), 90: ("DescribeShareGroupOffsets", SHARE_GROUPS),
    91: ("AlterShareGroupOffsets", SHARE_GROUPS), 92: ("DeleteShareGroupOffsets", SHARE_GROUPS),
    88: ("StreamsGroupHeartbeat", STREAMS_GROUPS), 89: ("StreamsGroupDescribe", STREAMS_GROUPS),
    93: ("StreamsGroupTopologyDescriptionUpdate", STREAMS_GROUPS),
}  # fmt: skip

# Served APIs whose newest versions in Kafka 4.4.0 Kafscale does not serve: key -> (name, newest served, why).
KIO = "kio 0.6.2, the pinned protocol library, has no schema for them"
NEWEST: dict[int, tuple[str, int, str]] = {
    0: ("Produce", 12, "v13 names topics by id (KIP-516); " + KIO), 1: ("Fetch", 17, KIO),
    3: ("Metadata", 12, KIO), 15: ("DescribeGroups", 5, KIO),
    18: ("ApiVersions", 4, KIO), 42: ("DeleteGroups", 2, KIO), 60: ("DescribeCluster", 1, KIO),
    35: ("DescribeLogDirs", 4, KIO),
    2: ("ListOffsets", 8, "v9 lists the latest tiered offset (KIP-1005), there are no tiers here; " + KIO),
    8: ("OffsetCommit", 9, "v10 names topics by id (KIP-848's last part); " + KIO),
    9: ("OffsetFetch", 9, "v10 names topics by id (KIP-848's last part); " + KIO),
    69: ("ConsumerGroupDescribe", 0, "v1 adds each member's type, classic or consumer (KIP-1099); " + KIO),
    28: ("TxnOffsetCommit", 5, "v6, new in Kafka 4.4, is not built yet; " + KIO),
    10: ("FindCoordinator", 5, "v6 finds share coordinators (KIP-932): " + SHARE_GROUPS),
    27: ("WriteTxnMarkers", 1, "v2 names each marker's transaction version (KIP-1228); Kafscale's coordinators do not "
                              "send markers through this API; " + KIO),
    66: ("ListTransactions", 1, "v2 filters by a transactional id pattern (KIP-1152); " + KIO),
    11: ("JoinGroup", 7, "v8 reasons (KIP-800) and v9 a static leader's skipped assignment (KIP-814): not yet"),
}  # fmt: skip


def table(port: int) -> dict[int, tuple[int, int]]:
    with Peer("any", port) as peer:
        answer = peer.call(req(API_VERSIONS, client_software_name="kafscale-differential",
                               client_software_version="1"))
    assert code(answer.error_code) == "NONE"
    return {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in answer.api_keys}


def side_by_side(kafka: dict[int, tuple[int, int]], old: dict[int, tuple[int, int]],
                 ours: dict[int, tuple[int, int]]) -> str:
    """The three tables, one key a line: what a failure prints."""
    def cell(t: dict[int, tuple[int, int]], key: int) -> str:
        return f"v{t[key][0]}-{t[key][1]}" if key in t else "-"

    lines = [f"{'key':>4}  {'Kafka 4.4.0':>11}  {'Kafka 3.9.2':>11}  {'Kafscale':>9}"]
    for key in sorted(kafka.keys() | old.keys() | ours.keys()):
        lines.append(f"{key:>4}  {cell(kafka, key):>11}  {cell(old, key):>11}  {cell(ours, key):>9}")
    return "\n".join(lines)


def test_the_table_is_kafkas_less_the_documented_omissions(kafka_reference: ReferenceKafka,
                                                           kafka_reference_39: ReferenceKafka,
                                                           kafscale: Cluster) -> None:
    kafka, old, ours = table(kafka_reference.port), table(kafka_reference_39.port), table(kafscale.port)
    shown = "\n" + side_by_side(kafka, old, ours)
    # Every omission is a real one: the key exists in Kafka 4.4.0, the newest version served is below its.
    assert NOT_SERVED.keys() <= kafka.keys(), shown
    assert [k for k, (_, newest, _) in NEWEST.items() if not newest < kafka[k][1]] == [], shown
    expected = {key: NEWEST[key][1] if key in NEWEST else hi for key, (_, hi) in kafka.items() if key not in NOT_SERVED}
    assert {key: hi for key, (_, hi) in ours.items()} == expected, shown
    # Older than Kafka 4.4.0 serves is intended, as long as Kafka 3.9.2 served it.
    too_old = {key: lo for key, (lo, _) in ours.items() if not old.get(key, kafka[key])[0] <= lo <= kafka[key][0]}
    assert too_old == {}, shown


def test_every_omission_is_documented() -> None:
    listed = COMPATIBILITY.read_text()
    missing = [name for name, _ in NOT_SERVED.values() if f"`{name}`" not in listed]
    missing += [f"{name} v{newest + 1}+" for name, newest, _ in NEWEST.values()
                if f"`{name}` v{newest + 1}" not in listed]
    assert missing == []


def transaction_version(port: int, version: int, name: str = "transaction.version"
                        ) -> tuple[tuple[int, int] | None, tuple[int, int] | None, bool]:
    """A feature (`transaction.version` unless named) of an ApiVersions answer of this version: the supported
    range, the finalized levels, and whether the finalized epoch is one a client takes (>= 0)."""
    with Peer("any", port) as peer:
        answer = peer.call(req(API_VERSIONS, version=version, client_software_name="kafscale-differential",
                               client_software_version="1"))
    supported = [(int(f.min_version), int(f.max_version)) for f in answer.supported_features if f.name == name]
    finalized = [(int(f.min_version_level), int(f.max_version_level)) for f in answer.finalized_features
                 if f.name == name]
    return (supported[0] if supported else None, finalized[0] if finalized else None,
            int(answer.finalized_features_epoch) >= 0)


def test_transactions_v2_is_advertised_as_kafka_does(kafka_reference: ReferenceKafka, kafscale: Cluster) -> None:
    """A Kafka 4 client uses transactions v2 (KIP-890 part 2) once `transaction.version` is finalized at 2 with an
    epoch it takes; v3 answers leave out supported features whose minimum is 0."""
    for version in (3, 4):
        ours, kafkas = transaction_version(kafscale.port, version), transaction_version(kafka_reference.port, version)
        assert ours == kafkas, (version, ours, kafkas)
    assert transaction_version(kafscale.port, 4) == ((0, 2), (2, 2), True)


def test_the_consumer_group_protocol_is_advertised_as_kafka_does(kafka_reference: ReferenceKafka,
                                                                 kafscale: Cluster) -> None:
    """`group.version` finalized at 1: the consumer group protocol (KIP-848) is served."""
    for version in (3, 4):
        ours = transaction_version(kafscale.port, version, "group.version")
        kafkas = transaction_version(kafka_reference.port, version, "group.version")
        assert ours == kafkas, (version, ours, kafkas)
    assert transaction_version(kafscale.port, 4, "group.version")[1] == (1, 1)
