"""The metrics endpoint moves with traffic, /healthz and /readyz answer (readyz follows an S3 outage), the
Grafana dashboard only queries metrics that exist, and the figures reach Ray's metrics."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from kafscale.config import BrokerConfig
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.s3_store import S3Store
from kafscale.testing.inprocess import InProcessBroker
from kafscale.testing.s3_servers import MotoS3Server, unique_bucket_name
from tests.integration.conftest import Cluster, unique_topic, wait_until

pytestmark = pytest.mark.timeout(120)
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kafscale-dashboard.json"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _base(cluster: Cluster) -> str:
    core = cluster.broker.shard
    assert core is not None and core.metrics_server is not None
    return f"http://127.0.0.1:{core.metrics_server.port}"


def _scrape(cluster: Cluster) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = _get(_base(cluster) + "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _sum(samples: dict[Any, float], name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def test_metrics_move_with_traffic(broker_embedded: Cluster) -> None:
    topic = unique_topic("metrics")
    before = _scrape(broker_embedded)
    p = Producer({"bootstrap.servers": broker_embedded.bootstrap, "linger.ms": 5})
    for _ in range(50):
        p.produce(topic, value=b"m" * 100, partition=0)
    assert p.flush(15) == 0
    c = Consumer({"bootstrap.servers": broker_embedded.bootstrap, "group.id": f"g-{topic}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = 0
        deadline = time.monotonic() + 20
        while got < 50 and time.monotonic() < deadline:
            m = c.poll(0.5)
            got += m is not None and m.error() is None
        assert got == 50
    finally:
        c.close()
    after = _scrape(broker_embedded)

    for api in ("Produce", "Fetch", "Metadata"):
        name = "kafscale_request_duration_seconds_count"
        assert _value(after, name, api=api) > _value(before, name, api=api), api
    assert _value(after, "kafscale_records_in_total", topic=topic) == 50
    assert _value(after, "kafscale_bytes_in_total", topic=topic) > 5000
    assert _value(after, "kafscale_records_out_total", topic=topic) >= 50
    assert _value(after, "kafscale_bytes_out_total", topic=topic) > 5000
    assert _sum(after, "kafscale_flush_duration_seconds_count") > _sum(before, "kafscale_flush_duration_seconds_count")
    assert _sum(after, "kafscale_flush_size_bytes_sum") > _sum(before, "kafscale_flush_size_bytes_sum")
    s3 = "kafscale_s3_request_duration_seconds_count"
    # The partition's segments (with their indexes) go up in packs, one conditional PUT each (pack_segments) ...
    calls = _value(after, s3, op="put_if_absent") - _value(before, s3, op="put_if_absent")
    assert calls > 0
    # ... which S3 bills as one PUT each.
    puts = "kafscale_object_store_requests_total"
    assert _value(after, puts, kind="put") - _value(before, puts, kind="put") == calls
    meta = "kafscale_metadata_request_duration_seconds_count"
    assert _value(after, meta, op="txn") > _value(before, meta, op="txn")
    assert _value(after, "kafscale_partition_high_watermark", topic=topic, partition="0") == 50
    assert _value(after, "kafscale_shards") == 1 and _value(after, "kafscale_partition_owners") >= 1
    assert _value(after, "kafscale_s3_health_state") == 0
    lookups = _value(after, "kafscale_cache_hits_total") + _value(after, "kafscale_cache_misses_total")
    assert lookups > 0 and 0 <= _value(after, "kafscale_cache_hit_ratio") <= 1

    assert _get(_base(broker_embedded) + "/healthz")[0] == 200
    status, body = _get(_base(broker_embedded) + "/readyz")
    assert status == 200 and json.loads(body)["ready"] is True


def test_load_figures_follow_traffic(broker_embedded: Cluster) -> None:
    """What the controller scales by (kafscale.ops.load_meter), also on /metrics: a partition's produce rate,
    the shard's request rate and busy fraction, measured while a producer sends about 1 MB/s."""
    topic = unique_topic("load")
    p = Producer({"bootstrap.servers": broker_embedded.bootstrap, "linger.ms": 5})
    started = time.monotonic()
    sent = 0
    samples: dict[Any, float] = {}
    while time.monotonic() - started < 8:
        for _ in range(10):
            p.produce(topic, value=b"L" * 10_000, partition=0)
        sent += 100_000
        p.poll(0)
        time.sleep(0.1)
        samples = _scrape(broker_embedded)
        if time.monotonic() - started > 3 and _value(samples, "kafscale_partition_bytes_in_per_second", topic=topic,
                                                     partition="0") > 0:
            break
    assert p.flush(15) == 0
    offered = sent / (time.monotonic() - started)
    rate = _value(samples, "kafscale_partition_bytes_in_per_second", topic=topic, partition="0")
    assert 0.3 * offered < rate < 3 * offered, (rate, offered)
    assert _value(samples, "kafscale_shard_bytes_in_per_second") >= rate
    # The sample that saw the bytes saw the requests that brought them: how many depends on how fast this loop
    # (and its scrapes) ran on the machine, so the figure is only required to count them.
    assert _value(samples, "kafscale_shard_requests_per_second") > 0
    assert 0 < _value(samples, "kafscale_shard_busy_ratio") < 4


def test_group_coordinators_gauge_counts_the_groups_a_shard_hosts(broker_embedded: Cluster) -> None:
    topic = unique_topic("coordinated")
    p = Producer({"bootstrap.servers": broker_embedded.bootstrap})
    p.produce(topic, value=b"x")
    assert p.flush(15) == 0
    before = _value(_scrape(broker_embedded), "kafscale_group_coordinators")
    c = Consumer({"bootstrap.servers": broker_embedded.bootstrap, "group.id": f"g-{topic}",
                  "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                break
        else:
            raise AssertionError("the group never delivered the record")
        assert _value(_scrape(broker_embedded), "kafscale_group_coordinators") == before + 1
    finally:
        c.close()


def test_dashboard_queries_only_existing_metrics(broker_embedded: Cluster) -> None:
    core = broker_embedded.broker.shard
    assert core is not None
    existing = core.metrics.names()
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 10
    for expr in exprs:
        names = re.findall(r"\bkafscale_[a-z0-9_]+", expr)
        assert names, expr
        for name in names:
            family = re.sub(r"_(bucket|sum|count|total)$", "", name)
            assert family in existing, f"{name} (in {expr!r}) is not a metric the broker exports"


class _RestartableMoto:
    """moto on a fixed port, stopped and started again: an S3 outage as clients see it (moto keeps its
    data in process memory, so the bucket is still there after the restart)."""

    def __init__(self) -> None:
        self.server = MotoS3Server()
        self.port = self.server.port
        self.endpoint_url = self.server.endpoint_url

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        restarted = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        restarted.start()
        self.server._server = restarted
        self.server._stopped = False


@pytest.fixture
def s3_outage_broker(tmp_path: Path) -> Iterator[tuple[InProcessBroker, _RestartableMoto]]:
    moto = _RestartableMoto()
    bucket = unique_bucket_name("ready")
    cfg = BrokerConfig(shards_per_node=1, s3_health_window_s=2.0)
    # The bucket is made with default timeouts: moto serves from this process, sharing its GIL with the
    # broker, and on a busy machine one request can outlast the broker's short read timeout (CI did).
    moto.server.store(bucket).close()

    def objects() -> S3Store:
        # Short timeouts and no retries, so the outage shows in the health window without delay.
        return S3Store(bucket, endpoint_url=moto.endpoint_url, region="us-east-1", access_key="k", secret_key="s",
                       create_bucket=False, max_attempts=1, connect_timeout=0.5, read_timeout=2)

    broker = InProcessBroker(cfg, meta=lambda: EmbeddedStore(tmp_path / "meta.sqlite"), objects=objects).start()
    try:
        yield broker, moto
    finally:
        broker.stop()
        moto.stop()


def test_readyz_follows_s3_outage(s3_outage_broker: tuple[InProcessBroker, _RestartableMoto]) -> None:
    broker, moto = s3_outage_broker
    assert broker.shard is not None and broker.shard.metrics_server is not None
    url = f"http://127.0.0.1:{broker.shard.metrics_server.port}/readyz"
    wait_until(lambda: _get(url)[0] == 200, timeout=30, what="ready before the outage")
    moto.stop()
    _, body = wait_until(lambda: (r := _get(url))[0] == 503 and r, timeout=30, what="unready during outage")
    assert json.loads(body)["checks"]["object_store"] != "ok"
    assert _get(url.replace("/readyz", "/healthz"))[0] == 200  # alive all the same
    moto.start()
    wait_until(lambda: _get(url)[0] == 200, timeout=30, what="ready after the outage")


def test_metrics_mirrored_to_ray(ray_runtime: Any) -> None:
    @ray_runtime.remote(num_cpus=0)
    class Probe:
        def push(self) -> int:
            from kafscale.ops.metrics import ShardMetrics
            from kafscale.ops.ray_mirror import RayMirror

            m = ShardMetrics()
            m.observe_request(0, 0.002)
            m.partition("t").flushed(100, 3, 161, 0.05)
            mirror = RayMirror(m.registry, 0)
            first = mirror.push()
            m.partition("t").flushed(50, 1, 111, 0.05)
            return first + mirror.push()

    probe = Probe.remote()
    assert ray_runtime.get(probe.push.remote(), timeout=60) > 0
    ray_runtime.kill(probe)


def test_consumer_lag_from_committed_offsets(broker_embedded: Cluster) -> None:
    """Lag = high watermark - committed offset, per group and partition. The offset is written where the
    group coordinator commits it (kafscale.cluster.keys.group_offset), as OffsetCommit would."""
    from kafscale.cluster import keys

    topic, group = unique_topic("lag"), "lag/group"  # a '/' in the id: keys percent-encode it
    p = Producer({"bootstrap.servers": broker_embedded.bootstrap, "linger.ms": 5})
    for _ in range(25):
        p.produce(topic, value=b"x", partition=0)
    assert p.flush(15) == 0
    core, meta = broker_embedded.broker.shard, broker_embedded.broker.meta
    assert core is not None and meta is not None
    broker_embedded.broker.run(meta.put(keys.group_offset(group, topic, 0),
                                        {"offset": 10, "leader_epoch": -1, "metadata": "", "commit_ms": 0}))
    broker_embedded.broker.run(core.lag_sampler.sample())
    assert _value(_scrape(broker_embedded), "kafscale_consumer_lag", group=group, topic=topic, partition="0") == 15
