"""Raw requests for the differential cases: one `Peer` (a KafkaWire with names) per broker, the same request to each.

Each case sends byte-identical requests, built here at one fixed version per API (`VERSIONS`: the highest both
Apache Kafka 4.4.0 and Kafscale serve), to the reference and to Kafscale, and compares what comes back. What may
legitimately differ between two brokers (node ids, ports, topic ids, cluster ids, generated member ids,
timestamps the broker stamps) is normalised by the case that meets it, with a comment saying so.
"""

from __future__ import annotations

import datetime
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from kafscale.protocol import make, request_class
from kafscale.protocol.errors import ErrorCode
from tests.integration.conftest import KafkaWire

PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH = 0, 1, 2, 3, 8, 9
DELETE_RECORDS = 21
FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS = 15, 16
API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS = 18, 19, 20
DESCRIBE_CONFIGS, ALTER_CONFIGS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS, OFFSET_DELETE = 32, 33, 37, 44, 47

# The version each case speaks: the newest that Kafka 4.4.0 and Kafscale both serve.
VERSIONS = {
    PRODUCE: 9, FETCH: 12, LIST_OFFSETS: 8, METADATA: 12, OFFSET_COMMIT: 8, OFFSET_FETCH: 8, JOIN_GROUP: 7,
    FIND_COORDINATOR: 4, HEARTBEAT: 4, LEAVE_GROUP: 5, SYNC_GROUP: 5, DESCRIBE_GROUPS: 5, LIST_GROUPS: 5,
    API_VERSIONS: 3, CREATE_TOPICS: 7, DELETE_TOPICS: 6, DESCRIBE_CONFIGS: 4, ALTER_CONFIGS: 2, CREATE_PARTITIONS: 3,
    INCREMENTAL_ALTER_CONFIGS: 1, OFFSET_DELETE: 0, DELETE_RECORDS: 2,
}  # fmt: skip

TIMEOUT = datetime.timedelta(seconds=30)
T0 = 1_700_000_000_000  # record timestamps the cases choose (CreateTime: both brokers keep them)

Row = tuple[bytes | None, bytes | None, int]  # key, value, timestamp


def req(api_key: int, /, version: int | None = None, **fields: Any) -> Any:
    """A request of VERSIONS[api_key] (or `version`) from keyword fields; make() drops what the version lacks."""
    return make(request_class(api_key, VERSIONS[api_key] if version is None else version), **fields)


def sub(api_key: int, entity: str, /, version: int | None = None, **fields: Any) -> Any:
    """A nested request entity (a topic, a partition, a protocol) of the version `req` uses."""
    module = sys.modules[request_class(api_key, VERSIONS[api_key] if version is None else version).__module__]
    return make(getattr(module, entity), **fields)


def batch(rows: list[Row]) -> bytes:
    """One v2 record batch (no producer id, uncompressed) holding the rows in order, built by aiokafka."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=16 * 1024 * 1024)
    for delta, (key, value, timestamp) in enumerate(rows):
        assert builder.append(delta, timestamp=timestamp, key=key, value=value, headers=[]) is not None
    return bytes(builder.build())


def code(value: int | ErrorCode) -> str:
    """An error code by its name (pytest's diffs then read UNKNOWN_MEMBER_ID rather than 25)."""
    return ErrorCode(int(value)).name.upper()


class Peer(KafkaWire):
    """One broker under test: Apache Kafka (`name` "kafka") or Kafscale ("kafscale"), one connection."""

    def __init__(self, name: str, port: int) -> None:
        super().__init__(port)
        self.name = name
        self.port = port

    def __enter__(self) -> Peer:
        return self

    def connect(self) -> Peer:
        """Another connection to the same broker (a second group member, a request that must wait)."""
        return Peer(self.name, self.port)

    # ---- topics

    def create(self, topic: str, partitions: int = 1, configs: dict[str, str | None] | None = None) -> Any:
        """CreateTopics for one topic: its CreatableTopicResult."""
        entry = sub(CREATE_TOPICS, "CreatableTopic", name=topic, num_partitions=partitions, replication_factor=-1,
                    assignments=(), configs=tuple(sub(CREATE_TOPICS, "CreatableTopicConfig", name=k, value=v)
                                                  for k, v in (configs or {}).items()))
        return self.call(req(CREATE_TOPICS, topics=(entry,), timeout=TIMEOUT, validate_only=False)).topics[0]

    def create_ready(self, topic: str, partitions: int = 1, configs: dict[str, str | None] | None = None) -> None:
        """Create a topic and wait until every partition has a leader that answers (Kafka elects its leaders
        a moment after CreateTopics returns; until then they answer NOT_LEADER_OR_FOLLOWER)."""
        created = self.create(topic, partitions, configs)
        assert created.error_code == ErrorCode.none, (self.name, created.error_code, created.error_message)
        deadline = time.monotonic() + 30
        for p in range(partitions):
            while (answer := self.list_offsets(topic, [(p, -1)])[p]).error_code != ErrorCode.none:
                assert time.monotonic() < deadline, (self.name, topic, p, answer)
                time.sleep(0.05)

    # ---- groups

    def coordinator(self, group: str) -> None:
        """FindCoordinator until the group has one, loaded. Kafka creates __consumer_offsets on the first request
        and answers NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE or COORDINATOR_LOAD_IN_PROGRESS until it has loaded
        it; each broker here is its own single coordinator, so the connection to it is already the right one."""
        deadline = time.monotonic() + 30
        while True:
            answer = self.call(req(FIND_COORDINATOR, key_type=0, coordinator_keys=(group,)))
            if answer.coordinators[0].error_code == ErrorCode.none:
                assert answer.coordinators[0].port == self.port
                # Loaded too: a Kafka coordinator still loading answers a Heartbeat NONE ("blindly").
                described = self.call(req(DESCRIBE_GROUPS, groups=(group,), include_authorized_operations=False))
                if described.groups[0].error_code == ErrorCode.none:
                    return
            assert time.monotonic() < deadline, (self.name, group, answer)
            time.sleep(0.05)

    # ---- data

    def append(self, topic: str, partition: int, rows: list[Row]) -> int:
        """Produce one batch with acks=all; its base offset."""
        answer = self.produce(topic, partition, batch(rows))
        assert answer.error_code == ErrorCode.none, (self.name, answer)
        return int(answer.base_offset)

    def list_offsets(self, topic: str, queries: list[tuple[int, int]], *, version: int | None = None,
                     isolation_level: int = 0) -> dict[int, Any]:
        """ListOffsets for (partition, timestamp) pairs of one topic: partition -> ListOffsetsPartitionResponse.
        Keyed by partition: Kafka answers the partitions of a topic in no particular order."""
        v = VERSIONS[LIST_OFFSETS] if version is None else version
        parts = tuple(sub(LIST_OFFSETS, "ListOffsetsPartition", version=v, partition_index=p, timestamp=ts,
                          current_leader_epoch=-1, max_num_offsets=1) for p, ts in queries)
        answer = self.call(req(LIST_OFFSETS, version=v, replica_id=-1, isolation_level=isolation_level,
                               topics=(sub(LIST_OFFSETS, "ListOffsetsTopic", version=v, name=topic,
                                           partitions=parts),)))
        [found] = answer.topics
        return {int(p.partition_index): p for p in found.partitions}


@dataclass
class Peers:
    """The reference and Kafscale, each behind a connection of its own."""

    kafka: Peer
    kafscale: Peer

    def __iter__(self) -> Iterator[Peer]:
        return iter((self.kafka, self.kafscale))


def unique(prefix: str) -> str:
    """A group id (or other name) no other case uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
