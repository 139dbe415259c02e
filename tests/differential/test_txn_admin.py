"""The transactions' admin APIs against Apache Kafka 4.4.0: ListTransactions, DescribeTransactions,
DescribeProducers and WriteTxnMarkers (what `kafka-transactions.sh` sends), for an ongoing, a committed and an
aborted transaction, in raw requests (the producers of tests/differential/test_transactions.py).

Each test runs twice, as there: `[reference]` holds Kafka's answers to the values written here, `[kafscale]` runs
the case on Kafka and then on Kafscale and compares. Normalised: producer ids (by the case's name for them, A, B,
C), times (a transaction's start "set" or -1; a producer's last timestamp as its last batch's timestamp, or "now"
when a marker set it) and coordinator epochs ("set" when >= 0: Kafka's is the leader epoch of a
__transaction_state partition, Kafscale's its slot's coordinator incarnation). Only the case's own producer ids are
looked at: the reference broker is shared with other cases. Versions: ListTransactions v1, DescribeTransactions v0,
DescribeProducers v0, WriteTxnMarkers v1 (the newest kio knows).
"""

from __future__ import annotations

import struct
import sys
import time
from typing import Any

from kafscale.protocol import make, request_class
from tests.differential.test_transactions import (
    READ_COMMITTED,
    ROWS,
    T0,
    Txn,
    compare,
    latest,
    latest_of,
    wait_for,
)
from tests.differential.test_transactions import brokers as brokers  # the fixture
from tests.differential.wire import Peer, code

DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS, WRITE_TXN_MARKERS = 61, 65, 66, 27
ADMIN_VERSIONS = {DESCRIBE_PRODUCERS: 0, DESCRIBE_TRANSACTIONS: 0, LIST_TRANSACTIONS: 1, WRITE_TXN_MARKERS: 1}
RECENT_MS = 600_000


def areq(api_key: int, /, **fields: Any) -> Any:
    return make(request_class(api_key, ADMIN_VERSIONS[api_key]), **fields)


def asub(api_key: int, entity: str, /, **fields: Any) -> Any:
    return make(getattr(sys.modules[request_class(api_key, ADMIN_VERSIONS[api_key]).__module__], entity), **fields)


class Names:
    """The case's producers by name: producer id -> "A", ...; transactional id -> "A", ..."""

    def __init__(self, **txns: Txn) -> None:
        self.by_pid = {t.producer_id: name for name, t in txns.items()}
        self.by_tid = {t.id: name for name, t in txns.items()}

    def pid(self, producer_id: int) -> str | int:
        return self.by_pid.get(producer_id, producer_id)


def listed(peer: Peer, names: Names, **filters: Any) -> tuple[str, list[str], dict[str, tuple[Any, str]]]:
    """ListTransactions of the case's producer ids (and `filters`): error, unknown state filters, and
    transactional id name -> (producer, state)."""
    answer = peer.call(areq(LIST_TRANSACTIONS, producer_id_filters=tuple(names.by_pid), **filters))
    return (code(answer.error_code), list(answer.unknown_state_filters),
            {names.by_tid.get(s.transactional_id, s.transactional_id): (names.pid(int(s.producer_id)),
                                                                        s.transaction_state)
             for s in answer.transaction_states})


def described(peer: Peer, names: Names, *tids: str) -> dict[str, Any]:
    """DescribeTransactions, read from the raw answer: kio cannot decode a start time of -1 (an id with no
    transaction since InitProducerId), which both brokers send."""
    peer.send(areq(DESCRIBE_TRANSACTIONS, transactional_ids=tids))
    out = {}
    for s in raw_describe_transactions(peer):
        error = code(s["error"])
        out[names.by_tid.get(s["transactional_id"], s["transactional_id"])] = {
            "error": error, "state": s["state"],
            "producer": names.pid(s["producer_id"]) if error == "NONE" else s["producer_id"],
            "epoch": s["epoch"], "timeout_ms": s["timeout_ms"],
            "start": "set" if s["start_ms"] > 0 else s["start_ms"], "topics": sorted(s["topics"])}
    return out


def raw_describe_transactions(peer: Peer) -> list[dict[str, Any]]:
    """The next frame on the connection as DescribeTransactions v0's response (flexible, header v1)."""
    while not peer.ready:
        data = peer.sock.recv(1 << 20)
        assert data, "connection closed by the broker"
        peer.ready += peer.frames.feed(data)
    buf, at = bytes(peer.ready.pop(0)), 4
    peer.sent.pop(int.from_bytes(buf[:4], "big", signed=True))

    def varint() -> int:
        nonlocal at
        shift = value = 0
        while True:
            b = buf[at]
            at += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def fixed(fmt: str) -> int:
        nonlocal at
        (value,) = struct.unpack_from(fmt, buf, at)
        at += struct.calcsize(fmt)
        return int(value)

    def string() -> str:
        nonlocal at
        n = varint() - 1
        at += n
        return buf[at - n:at].decode()

    def tags() -> None:
        nonlocal at
        for _ in range(varint()):
            varint()
            at += varint()

    tags()  # the response header's
    fixed(">i")  # throttle time
    states = []
    for _ in range(varint() - 1):
        s: dict[str, Any] = {"error": fixed(">h"), "transactional_id": string(), "state": string(),
                             "timeout_ms": fixed(">i"), "start_ms": fixed(">q"), "producer_id": fixed(">q"),
                             "epoch": fixed(">h"), "topics": []}
        for _ in range(varint() - 1):
            topic = string()
            s["topics"].append((topic, sorted(fixed(">i") for _ in range(varint() - 1))))
            tags()
        tags()
        states.append(s)
    return states


def when(timestamp: int) -> str | int:
    if timestamp == -1 or T0 <= timestamp < T0 + 1000:
        return timestamp - T0 if timestamp != -1 else -1
    return "now" if abs(time.time() * 1000 - timestamp) < RECENT_MS else timestamp


def producers(peer: Peer, names: Names, topic: str, partitions: tuple[int, ...]) -> dict[int, Any]:
    """DescribeProducers: partition -> (error, the case's producers as (name, epoch, last sequence, last timestamp
    (relative to T0, or "now"), coordinator epoch ("set" or -1), current transaction start offset))."""
    answer = peer.call(areq(DESCRIBE_PRODUCERS, topics=(
        asub(DESCRIBE_PRODUCERS, "TopicRequest", name=topic, partition_indexes=partitions),)))
    (t,) = answer.topics
    return {int(p.partition_index): (code(p.error_code), p.error_message, sorted(
        (names.pid(int(a.producer_id)), int(a.producer_epoch), int(a.last_sequence), when(int(a.last_timestamp)),
         "set" if int(a.coordinator_epoch) >= 0 else int(a.coordinator_epoch), int(a.current_txn_start_offset))
        for a in p.active_producers if int(a.producer_id) in names.by_pid)) for p in t.partitions}


def three_transactions(peer: Peer, topic: str) -> tuple[Names, Txn, Txn, Txn]:
    """Partition 0: A's transaction, left open (offsets 0-2). Partition 1: B's, committed (0-2, COMMIT at 3), then
    C's, aborted (4-6, ABORT at 7)."""
    peer.create_ready(topic, 2)
    a, b, c = Txn(peer), Txn(peer), Txn(peer)
    assert a.add_partitions({topic: [0]}) == {f"{topic}:0": "NONE"}
    assert a.produce(topic, 0, ROWS) == ("NONE", 0)
    assert b.add_partitions({topic: [1]}) == {f"{topic}:1": "NONE"}
    assert b.produce(topic, 1, ROWS) == ("NONE", 0)
    assert b.end(True) == "NONE"
    wait_for("B's marker", lambda: latest_of(peer, topic, 1), lambda hw: hw == 4)
    assert c.add_partitions({topic: [1]}) == {f"{topic}:1": "NONE"}
    assert c.produce(topic, 1, ROWS) == ("NONE", 4)
    assert c.end(False) == "NONE"
    wait_for("C's marker", lambda: latest_of(peer, topic, 1), lambda hw: hw == 8)
    names = Names(A=a, B=b, C=c)
    wait_for("B and C complete", lambda: listed(peer, names)[2],
             lambda states: states.get("B", (0, ""))[1] == "CompleteCommit"
             and states.get("C", (0, ""))[1] == "CompleteAbort")
    return names, a, b, c


def test_list_transactions_with_kafkas_filters(brokers: list[Peer], topic: str) -> None:
    def case(peer: Peer) -> Any:
        names, *_ = three_transactions(peer, topic)
        return {
            "all": listed(peer, names),
            "ongoing": listed(peer, names, state_filters=("Ongoing",)),
            "complete": listed(peer, names, state_filters=("CompleteCommit", "CompleteAbort")),
            "unknown-state": listed(peer, names, state_filters=("ongoing", "Nope")),
            "longer-than-an-hour": listed(peer, names, duration_filter=3_600_000),
            "longer-than-0": listed(peer, names, duration_filter=0),
        }

    everything = {"A": ("A", "Ongoing"), "B": ("B", "CompleteCommit"), "C": ("C", "CompleteAbort")}
    compare(brokers, case, {
        "all": ("NONE", [], everything),
        "ongoing": ("NONE", [], {"A": ("A", "Ongoing")}),
        "complete": ("NONE", [], {"B": ("B", "CompleteCommit"), "C": ("C", "CompleteAbort")}),
        "unknown-state": ("NONE", ["ongoing", "Nope"], {}),
        "longer-than-an-hour": ("NONE", [], {}),
        "longer-than-0": ("NONE", [], everything),
    })  # fmt: skip


def test_describe_transactions_of_an_ongoing_a_committed_and_an_aborted_transaction(brokers: list[Peer],
                                                                                  topic: str) -> None:
    def case(peer: Peer) -> Any:
        names, a, b, c = three_transactions(peer, topic)
        idle = Txn(peer)
        names.by_tid[idle.id], names.by_pid[idle.producer_id] = "Idle", "Idle"
        return described(peer, names, a.id, b.id, c.id, idle.id, f"{topic}-never-seen")

    def state(name: str, s: str, topics: list[Any], start: str | int = "set") -> dict[str, Any]:
        return {"error": "NONE", "state": s, "producer": name, "epoch": 0, "timeout_ms": 60_000, "start": start,
                "topics": topics}

    compare(brokers, case, {
        "A": state("A", "Ongoing", [(topic, [0])]),
        "B": state("B", "CompleteCommit", []),
        "C": state("C", "CompleteAbort", []),
        "Idle": state("Idle", "Empty", [], -1),
        f"{topic}-never-seen": {"error": "TRANSACTIONAL_ID_NOT_FOUND", "state": "", "producer": 0, "epoch": 0,
                                "timeout_ms": 0, "start": 0, "topics": []},
    })  # fmt: skip


def test_describe_producers_of_the_partitions(brokers: list[Peer], topic: str) -> None:
    def case(peer: Peer) -> Any:
        names, *_ = three_transactions(peer, topic)
        return {"partitions": producers(peer, names, topic, (0, 1, 2)),
                "unknown-topic": producers(peer, names, f"{topic}-nope", (0,))}

    compare(brokers, case, {
        "partitions": {0: ("NONE", None, [("A", 0, 2, 2, -1, 0)]),
                       1: ("NONE", None, [("B", 0, 2, "now", "set", -1), ("C", 0, 2, "now", "set", -1)]),
                       2: ("UNKNOWN_TOPIC_OR_PARTITION", None, [])},
        "unknown-topic": {0: ("UNKNOWN_TOPIC_OR_PARTITION", "This server does not host this topic-partition.", [])},
    })  # fmt: skip


def test_write_txn_markers_aborts_a_hanging_transaction(brokers: list[Peer], topic: str) -> None:
    """What Admin.abortTransaction sends: an ABORT marker with the producer's id and epoch to the partition's
    leader. A's open transaction ends there; the last stable offset moves past it, and A's producer state shows
    no open transaction and the marker's coordinator epoch."""

    def case(peer: Peer) -> Any:
        names, a, *_ = three_transactions(peer, topic)
        before = latest(peer, topic, READ_COMMITTED)
        answer = peer.call(areq(WRITE_TXN_MARKERS, markers=(asub(
            WRITE_TXN_MARKERS, "WritableTxnMarker", producer_id=a.producer_id, producer_epoch=a.epoch,
            transaction_result=False, coordinator_epoch=0, topics=(
                asub(WRITE_TXN_MARKERS, "WritableTxnMarkerTopic", name=topic, partition_indexes=(0, 7)),
                asub(WRITE_TXN_MARKERS, "WritableTxnMarkerTopic", name=f"{topic}-nope", partition_indexes=(0,)))),)))
        written = sorted((names.pid(int(m.producer_id)), t.name.replace(topic, "T"), int(p.partition_index),
                    code(p.error_code)) for m in answer.markers for t in m.topics for p in t.partitions)
        return {"lso-before": before, "written": written, "lso-after": latest(peer, topic, READ_COMMITTED),
                "hw": latest_of(peer, topic, 0), "producers": producers(peer, names, topic, (0,))}

    compare(brokers, case, {
        "lso-before": ("NONE", 0),
        "written": [("A", "T", 0, "NONE"), ("A", "T", 7, "UNKNOWN_TOPIC_OR_PARTITION"),
                    ("A", "T-nope", 0, "UNKNOWN_TOPIC_OR_PARTITION")],
        "lso-after": ("NONE", 4), "hw": 4,
        "producers": {0: ("NONE", None, [("A", 0, 2, "now", "set", -1)])},
    })  # fmt: skip
