"""DescribeLogDirs side by side: each broker answers one log directory holding the partitions it has, sizes
growing with what was written; partitions and topics it does not have are left out (kafka-log-dirs and
AdminClient.describeLogDirs ask it of every broker)."""

from __future__ import annotations

from typing import Any

from kafscale.protocol import make, request_class
from tests.differential.wire import T0, Peers, code, unique

DESCRIBE_LOG_DIRS = 35


def describe(peer: Any, version: int, topics: dict[str, list[int]] | None) -> Any:
    cls = request_class(DESCRIBE_LOG_DIRS, version)
    module = __import__(cls.__module__, fromlist=["DescribableLogDirTopic"])
    wanted = None if topics is None else tuple(
        make(module.DescribableLogDirTopic, topic=t, partitions=tuple(ps)) for t, ps in topics.items())
    return peer.call(make(cls, topics=wanted))


def seen(answer: Any) -> tuple[Any, ...]:
    """What a client can compare: per log directory its error, and per topic the partitions with whether each
    holds data; v4's volume sizes known or not."""
    return tuple((code(r.error_code),
                  sorted((t.name, sorted((int(p.partition_index), p.partition_size > 0, int(p.offset_lag),
                                          p.is_future_key) for p in t.partitions)) for t in r.topics),
                  getattr(r, "total_bytes", 0) > 0, getattr(r, "usable_bytes", 0) > 0)
                 for r in answer.results)


def test_describe_log_dirs_reports_the_partitions_and_their_sizes_alike(peers: Peers, topic: str) -> None:
    absent = unique("absent")
    answers = {}
    for peer in peers:
        peer.create_ready(topic, partitions=2)
        peer.append(topic, 0, [(b"k", b"v" * 100, T0 + i) for i in range(10)])
        answers[peer.name] = [(version, int(getattr(a, "error_code", 0)), seen(a))
                              for version in (1, 2, 3, 4)  # Kafka 4 dropped v0 (KIP-896)
                              for a in (describe(peer, version, {topic: [0, 1, 7], absent: [0]}),)]
    assert answers["kafka"] == answers["kafscale"]
    [(_, [(name, partitions)], *_)] = answers["kafka"][-1][2]
    assert name == topic and partitions == [(0, True, 0, False), (1, False, 0, False)]


def test_describe_log_dirs_of_every_topic_names_each_partition(peers: Peers, topic: str) -> None:
    """No topic list: every partition the broker has, the new topic's among them, in one log directory."""
    for peer in peers:
        peer.create_ready(topic, partitions=3)
        [result] = describe(peer, 4, None).results
        assert result.error_code == 0 and result.log_dir, peer.name
        ours = [t for t in result.topics if t.name == topic]
        assert [sorted(int(p.partition_index) for p in t.partitions) for t in ours] == [[0, 1, 2]], peer.name
