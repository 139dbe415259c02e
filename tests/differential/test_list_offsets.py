"""ListOffsets against Apache Kafka 4.4.0: earliest, latest, max timestamp (KIP-734), earliest local (KIP-405), by
timestamp before, between and after the records, on an empty and a non-empty partition, unknown topics and
partitions, timestamps a version does not know.

Every case compares (error, offset, timestamp, leader epoch) per partition. Nothing is normalised: both brokers
keep the producer's timestamps (CreateTime), number offsets from 0 and start a new partition's leader epoch at 0.
Kafka answers the partitions of a topic in no fixed order; answers are keyed by partition (wire.Peer.list_offsets).
Each case also holds Kafka's answers to the values Kafka documents, so that it cannot pass with both brokers
agreeing on something else.
"""

from __future__ import annotations

from typing import Any

from tests.differential.wire import DELETE_RECORDS, LIST_OFFSETS, T0, TIMEOUT, Peer, Peers, code, req, sub

EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL = -2, -1, -3, -4

Answer = tuple[str, int, int, int]  # error, offset, timestamp, leader epoch


def answers(peer: Peer, topic: str, partition: int, targets: dict[str, int], version: int | None = None
            ) -> dict[str, Answer]:
    """One ListOffsets request per target (so that each is answered on its own), answers by label."""
    found = {}
    for label, timestamp in targets.items():
        p = peer.list_offsets(topic, [(partition, timestamp)], version=version)[partition]
        found[label] = (code(p.error_code), int(p.offset), int(p.timestamp), int(getattr(p, "leader_epoch", -1)))
    return found


def raw(peer: Peer, topic: str, queries: list[tuple[int, int, int]]) -> list[Any]:
    """One ListOffsets request of (partition, timestamp, current leader epoch): every partition answer."""
    parts = tuple(sub(LIST_OFFSETS, "ListOffsetsPartition", partition_index=p, timestamp=ts, current_leader_epoch=e)
                  for p, ts, e in queries)
    answer = peer.call(req(LIST_OFFSETS, replica_id=-1, isolation_level=0,
                           topics=(sub(LIST_OFFSETS, "ListOffsetsTopic", name=topic, partitions=parts),)))
    return [p for t in answer.topics for p in t.partitions]


def fill(peer: Peer, topic: str) -> None:
    """Partition 0: six records in three batches, timestamps out of order within the first, the largest timestamp
    twice (offsets 3 and 4); partition 1 stays empty."""
    peer.create_ready(topic, 2)
    assert peer.append(topic, 0, [(b"a", b"0", T0), (b"b", b"1", T0 + 10), (b"c", b"2", T0 + 5)]) == 0
    assert peer.append(topic, 0, [(b"d", b"3", T0 + 20)]) == 3
    assert peer.append(topic, 0, [(b"e", b"4", T0 + 20), (b"f", b"5", T0 + 15)]) == 4


TARGETS = {
    "earliest": EARLIEST, "latest": LATEST, "max-timestamp": MAX_TIMESTAMP, "earliest-local": EARLIEST_LOCAL,
    "before-all": T0 - 1, "first": T0, "between-0-and-1": T0 + 1, "above-an-earlier-record": T0 + 6,
    "between-batches": T0 + 11, "below-the-largest": T0 + 16, "largest": T0 + 20, "after-all": T0 + 21,
}  # fmt: skip

NOT_FOUND = ("NONE", -1, -1, -1)


def test_lookups_on_a_partition_with_records(peers: Peers, topic: str) -> None:
    got = {}
    for peer in peers:
        fill(peer, topic)
        got[peer.name] = answers(peer, topic, 0, TARGETS)
    assert got["kafka"] == {
        "earliest": ("NONE", 0, -1, 0),
        "latest": ("NONE", 6, -1, 0),
        "max-timestamp": ("NONE", 3, T0 + 20, 0),  # the first record with the largest timestamp
        "earliest-local": ("NONE", 0, -1, 0),  # no tiered storage: the log start
        "before-all": ("NONE", 0, T0, 0),
        "first": ("NONE", 0, T0, 0),
        "between-0-and-1": ("NONE", 1, T0 + 10, 0),  # the first offset at or after the time, not the nearest time
        "above-an-earlier-record": ("NONE", 1, T0 + 10, 0),
        "between-batches": ("NONE", 3, T0 + 20, 0),
        "below-the-largest": ("NONE", 3, T0 + 20, 0),
        "largest": ("NONE", 3, T0 + 20, 0),
        "after-all": NOT_FOUND,
    }
    assert got["kafscale"] == got["kafka"]


def test_lookups_on_an_empty_partition(peers: Peers, topic: str) -> None:
    got = {}
    for peer in peers:
        peer.create_ready(topic, 1)
        got[peer.name] = answers(peer, topic, 0, {"earliest": EARLIEST, "latest": LATEST,
                                                  "max-timestamp": MAX_TIMESTAMP, "earliest-local": EARLIEST_LOCAL,
                                                  "a-time": T0})
    assert got["kafka"] == {"earliest": ("NONE", 0, -1, 0), "latest": ("NONE", 0, -1, 0),
                            "max-timestamp": NOT_FOUND, "earliest-local": ("NONE", 0, -1, 0), "a-time": NOT_FOUND}
    assert got["kafscale"] == got["kafka"]


def test_lookups_after_delete_records(peers: Peers, topic: str) -> None:
    """The log start moves: earliest follows it, and a time before every record finds the first one kept."""
    got = {}
    for peer in peers:
        fill(peer, topic)
        deleted = peer.call(req(DELETE_RECORDS, timeout=TIMEOUT, topics=(sub(
            DELETE_RECORDS, "DeleteRecordsTopic", name=topic,
            partitions=(sub(DELETE_RECORDS, "DeleteRecordsPartition", partition_index=0, offset=2),)),)))
        assert deleted.topics[0].partitions[0].error_code == 0, (peer.name, deleted)
        got[peer.name] = answers(peer, topic, 0, {"earliest": EARLIEST, "latest": LATEST, "before-all": T0 - 1,
                                                  "deleted-time": T0 + 10, "max-timestamp": MAX_TIMESTAMP})
    assert got["kafka"] == {"earliest": ("NONE", 2, -1, 0), "latest": ("NONE", 6, -1, 0),
                            "before-all": ("NONE", 2, T0 + 5, 0), "deleted-time": ("NONE", 3, T0 + 20, 0),
                            "max-timestamp": ("NONE", 3, T0 + 20, 0)}
    assert got["kafscale"] == got["kafka"]


def test_unknown_topic_and_partition(peers: Peers, topic: str) -> None:
    got = {}
    for peer in peers:
        peer.create_ready(topic, 1)
        unknown_topic = peer.list_offsets(f"{topic}-none", [(0, LATEST)])[0]
        unknown_partition = peer.list_offsets(topic, [(1, EARLIEST), (5, T0)])
        got[peer.name] = [(code(p.error_code), p.offset, p.timestamp, p.leader_epoch)
                          for p in (unknown_topic, unknown_partition[1], unknown_partition[5])]
    assert got["kafka"] == [("UNKNOWN_TOPIC_OR_PARTITION", -1, -1, -1)] * 3
    assert got["kafscale"] == got["kafka"]


def test_timestamps_a_version_does_not_know(peers: Peers, topic: str) -> None:
    """-3 needs v7, -4 v8, -5 (latest tiered, KIP-1005) v9; any other negative timestamp is never valid. Kafka
    answers UNSUPPORTED_VERSION for them before it looks for the partition (so an unknown topic gets it too)."""
    targets = {"max-timestamp": MAX_TIMESTAMP, "earliest-local": EARLIEST_LOCAL, "latest-tiered": -5, "minus-7": -7}
    got: dict[str, Any] = {}
    for peer in peers:
        peer.create_ready(topic, 1)
        got[peer.name] = {
            f"v{v}": {label: answer[0] for label, answer in answers(peer, topic, 0, targets, version=v).items()}
            for v in (1, 6, 7, 8)
        }
        got[peer.name]["unknown-topic-v8"] = answers(peer, f"{topic}-none", 0, {"minus-7": -7}, version=8)["minus-7"]
    unsupported = "UNSUPPORTED_VERSION"
    assert got["kafka"] == {
        "v1": dict.fromkeys(targets, unsupported), "v6": dict.fromkeys(targets, unsupported),
        "v7": {**dict.fromkeys(targets, unsupported), "max-timestamp": "NONE"},
        "v8": {**dict.fromkeys(targets, unsupported), "max-timestamp": "NONE", "earliest-local": "NONE"},
        "unknown-topic-v8": (unsupported, -1, -1, -1),
    }  # fmt: skip
    assert got["kafscale"] == got["kafka"]


def test_a_partition_named_twice_is_answered_once_with_invalid_request(peers: Peers, topic: str) -> None:
    got = {}
    for peer in peers:
        peer.create_ready(topic, 2)
        answer = raw(peer, topic, [(0, LATEST, -1), (1, LATEST, -1), (0, EARLIEST, -1)])
        got[peer.name] = sorted((p.partition_index, code(p.error_code), p.offset) for p in answer)
    assert got["kafka"] == [(0, "INVALID_REQUEST", -1), (1, "NONE", 0)]
    assert got["kafscale"] == got["kafka"]


def test_the_current_leader_epoch_a_client_sends_is_not_checked(peers: Peers, topic: str) -> None:
    """Intended difference (docs/compatibility.md): Kafka refuses a current_leader_epoch newer than the leader's
    (UNKNOWN_LEADER_EPOCH; an older one is FENCED_LEADER_EPOCH). Kafscale does not check it: fencing between
    partition owners is its own (owner epochs in the metadata store) and a committed offset is never truncated, so
    a client with any epoch reads the truth (docs/architecture.md, "Visibility and fencing")."""
    got = {}
    for peer in peers:
        peer.create_ready(topic, 1)
        [p] = raw(peer, topic, [(0, LATEST, 7)])
        got[peer.name] = (code(p.error_code), p.offset)
    assert got == {"kafka": ("UNKNOWN_LEADER_EPOCH", -1), "kafscale": ("NONE", 0)}
