"""`kafscale proxy`: virtual partitions in front of a Kafka-compatible broker, ours and Tansu.

The issue's workload runs through the proxy as it runs natively (tests/integration/virtual_workload.py): every
record once, by its partition's owner, at the offset its producer was told, in per-key order; and the group's
committed offsets resume exactly the records not yet consumed, after the broker and the proxy restart.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.record.memory_records import MemoryRecords

from kafscale.protocol.errors import ErrorCode
from kafscale.testing.ports import free_port
from kafscale.testing.proxy import running_proxy
from kafscale.testing.tansu import TansuServer
from tests.integration.conftest import FETCH, Cluster, KafkaWire, build, nested_request, unique_topic, wait_until
from tests.integration.test_broker_errors import batch, rows
from tests.integration.virtual_workload import (
    check_consumed,
    consume_as_a_group,
    embedded_broker,
    produce_keyed,
    resumed,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

MAPPING = """
mapping:
  topics:
    "orders.*":
      virtual_partitions: 100
      physical_partitions: 10
    "small.*":
      virtual_partitions: 20
      physical_partitions: 10
      offset_range: 1048576
"""


def _create(bootstrap: str, topic: NewTopic) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the answer
    admin.create_topics([topic])[topic.topic].result(30)


def _partitions(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return len(admin.list_topics(topic, timeout=20).topics[topic].partitions)


def test_the_workload_through_the_proxy_in_front_of_kafscale_and_a_restart_of_both(tmp_path: Path) -> None:
    topic, group = "orders", "orders-app"
    b = embedded_broker(tmp_path)
    try:
        with running_proxy(b.bootstrap, MAPPING) as bootstrap:
            _create(bootstrap, NewTopic(topic, 100))
            assert _partitions(bootstrap, topic) == 100
            assert _partitions(b.bootstrap, topic) == 10  # upstream: the physical partitions only
            sent, members = consume_as_a_group(bootstrap, topic, group, 3000)
            check_consumed(sent, members)
            more = produce_keyed(bootstrap, topic, 3000, 500)  # not consumed
    finally:
        b.stop()
    b = embedded_broker(tmp_path)
    try:
        with running_proxy(b.bootstrap, MAPPING) as bootstrap:
            assert resumed(bootstrap, topic, group, len(more)) == more, "the committed offsets resume the rest"
    finally:
        b.stop()


def test_the_workload_through_the_proxy_in_front_of_tansu(tmp_path: Path) -> None:
    topic, group = "orders", "orders-app"
    with TansuServer(tmp_path) as tansu:
        with running_proxy(tansu.bootstrap, MAPPING) as bootstrap:
            _create(bootstrap, NewTopic(topic, 100))
            assert _partitions(bootstrap, topic) == 100
            assert _partitions(tansu.bootstrap, topic) == 10
            # Tansu's first join waits about half the session timeout: a short one keeps the test short
            sent, members = consume_as_a_group(bootstrap, topic, group, 3000, session_ms=6000)
            check_consumed(sent, members)
            more = produce_keyed(bootstrap, topic, 3000, 500)
        with running_proxy(tansu.bootstrap, MAPPING) as bootstrap:  # a new proxy: nothing it knew is needed
            assert resumed(bootstrap, topic, group, len(more)) == more


def _fetch(wire: KafkaWire, topic: str, partitions: list[tuple[int, int]]) -> dict[int, object]:
    parts = tuple(nested_request(FETCH, "FetchPartition", partition=p, fetch_offset=o, partition_max_bytes=1 << 20)
                  for p, o in partitions)
    request = build(FETCH, max_wait=datetime.timedelta(milliseconds=0), min_bytes=0, max_bytes=8 << 20,
                    topics=(nested_request(FETCH, "FetchTopic", topic=topic, partitions=parts),),
                    forgotten_topics_data=(), replica_id=-1, session_id=0, session_epoch=-1)
    return {p.partition_index: p for p in wire.call(request).responses[0].partitions}


def _values(records: bytes | None, start: int) -> tuple[list[tuple[int, bytes]], int]:
    """(offset, value) of the data records at or after `start`, and where a client's position ends up."""
    out, position = [], start
    batches = MemoryRecords(records or b"")
    while (b := batches.next_batch()) is not None:
        assert b.validate_crc()
        if not b.is_control_batch:
            out += [(r.offset, r.value) for r in b if r.offset >= start]
        position = max(position, b.next_offset)
    return out, position


def test_a_fetch_returns_only_its_virtual_partitions_records_and_moves_past_the_rest(broker_embedded: Cluster,
                                                                                     tmp_path: Path) -> None:
    topic = unique_topic("small")  # 20 virtual over 10: 3 and 13 share physical partition 3
    with running_proxy(broker_embedded.bootstrap, MAPPING) as bootstrap, \
            KafkaWire(int(bootstrap.rsplit(":")[1])) as wire:
        wire.create_topic(topic, 20)
        offsets = {}
        for lane, tag in [(3, "a"), (13, "b"), (3, "c"), (13, "d"), (13, "e")]:
            answer = wire.produce(topic, lane, batch(rows(tag, 3)))
            assert answer.error_code == ErrorCode.none
            offsets[tag] = answer.base_offset
        assert offsets == {"a": 0, "b": 3, "c": 6, "d": 9, "e": 12}  # the physical partition's numbering
        got = {3: [], 13: []}
        position = {3: 0, 13: 0}
        while min(position.values()) < 15:  # as a client does: fetch both lanes in one request from its positions
            answers = _fetch(wire, topic, sorted(position.items()))  # one physical partition, two lanes
            for lane, answer in answers.items():
                assert answer.high_watermark == 15
                values, position[lane] = _values(answer.records, position[lane])
                got[lane] += values
        assert got[3] == [(o, f"value {t} {i}".encode()) for t, first in [("a", 0), ("c", 6)]
                          for o, i in zip(range(first, first + 3), range(3), strict=True)]
        assert got[13] == [(o, f"value {t} {i}".encode()) for t, first in [("b", 3), ("d", 9), ("e", 12)]
                           for o, i in zip(range(first, first + 3), range(3), strict=True)]
        at = 9  # from here on only lane 13's records: lane 3's fetches return none, yet move it to the end
        while at < 15:
            values, moved = _values(_fetch(wire, topic, [(3, at)])[3].records, at)
            assert values == [] and moved > at
            at = moved

        assert _fetch(wire, topic, [(20, 0)])[20].error_code == ErrorCode.unknown_topic_or_partition
        # beyond the end: the upstream's own answer (R bounds nothing here: a lane's offsets are its records' own)
        assert _fetch(wire, topic, [(3, 1 << 20)])[3].error_code == ErrorCode.offset_out_of_range
        assert wire.produce(topic, 20, batch(rows("x", 1))).error_code == ErrorCode.unknown_topic_or_partition
        assert wire.produce(topic, 3, b"\x00" * 70).error_code in (ErrorCode.corrupt_message, ErrorCode.invalid_record)
        assert wire.list_offset(topic, 13, -1).offset == 15
        assert wire.list_offset(topic, 13, -2).offset == 0


def test_the_proxy_command_serves_and_exports_metrics(broker_embedded: Cluster, tmp_path: Path) -> None:
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(MAPPING)
    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kafscale.cli", "proxy", "--upstream", broker_embedded.bootstrap,
                             "--listen", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{metrics_port}",
                             "--mapping", str(mapping)], stderr=subprocess.PIPE, text=True)
    try:
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition

        topic = unique_topic("orders")

        def listening() -> bool:
            assert proc.poll() is None, f"the proxy exited: {proc.stderr.read() if proc.stderr else ''}"
            try:
                KafkaWire(port, timeout=5).close()
                return True
            except OSError:
                return False

        wait_until(listening, 60, "the proxy listening")  # a Python process starting: slow on a busy machine
        _create(f"127.0.0.1:{port}", NewTopic(topic, 100))
        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", enable_idempotence=True, acks="all")
        for lane in (5, 15, 25):
            producer.send(topic, value=f"to {lane}".encode(), partition=lane)
        producer.flush(30)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", auto_offset_reset="earliest")
        consumer.assign([TopicPartition(topic, 15)])
        got: list[tuple[int, bytes]] = []
        deadline, quiet_until = time.monotonic() + 60, None
        while time.monotonic() < deadline and (quiet_until is None or time.monotonic() < quiet_until):
            got += [(r.partition, r.value) for rs in consumer.poll(timeout_ms=200).values() for r in rs]
            if got and quiet_until is None:
                quiet_until = time.monotonic() + 3  # and 3 s more for a record that should not come
        consumer.close()
        assert got == [(15, b"to 15")]
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert 'kafscale_proxy_requests_total{api="Produce"}' in text
        dropped = [line for line in text.splitlines() if line.startswith("kafscale_proxy_fetch_batches_dropped_total")]
        assert dropped and float(dropped[0].split()[-1]) >= 2  # the batches of lanes 5 and 25 were left out
    finally:
        proc.terminate()
        proc.wait(20)


def test_the_proxy_refuses_to_start_on_a_bad_mapping_naming_the_topic(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("mapping:\n  topics:\n    payments:\n      virtual_partitions: 25\n      physical_partitions: 10\n")
    done = subprocess.run([sys.executable, "-m", "kafscale.cli", "proxy", "--upstream", "127.0.0.1:9",
                           "--mapping", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "payments" in done.stderr and "multiple" in done.stderr
