"""Every `kafscale` client command against a live broker: topic create/list/describe/alter/delete,
produce (stdin, keys, headers), consume (from-beginning, count, partition, JSON), cluster info."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kafscale.cli import main
from tests.integration.conftest import Cluster, unique_topic, wait_until

pytestmark = pytest.mark.timeout(120)


def cli(capsys: pytest.CaptureFixture[str], cluster: Cluster, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--bootstrap-server", cluster.bootstrap, "--timeout", "20"])
    out, err = capsys.readouterr()
    return code, out, err


def cli_process(cluster: Cluster, *argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """The installed entry point in a child process; the broker address from the environment."""
    env = {**os.environ, "KAFSCALE_BOOTSTRAP_SERVER": cluster.bootstrap}
    return subprocess.run([sys.executable, "-m", "kafscale.cli", *argv], input=stdin, capture_output=True,
                          env=env, timeout=60)


def test_topic_commands(broker_embedded: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic = unique_topic("cli-topic")
    code, out, _ = cli(capsys, broker_embedded, "topic", "create", topic, "-p", "2", "-c", "retention.ms=3600000")
    assert code == 0 and f"created topic {topic} with 2 partition(s)" in out

    code, _, err = cli(capsys, broker_embedded, "topic", "create", topic)
    assert code == 1 and "already exists" in err and "kafscale topic alter" in err

    code, out, _ = cli(capsys, broker_embedded, "topic", "list", "-o", "json")
    assert code == 0 and {"topic": topic, "partitions": 2} in json.loads(out)
    code, out, _ = cli(capsys, broker_embedded, "topic", "list")
    assert any(line.split() == [topic, "2"] for line in out.splitlines())

    code, out, _ = cli(capsys, broker_embedded, "topic", "alter", topic, "-p", "3", "--set", "retention.bytes=1000000",
                       "--delete", "retention.ms")
    assert code == 0 and f"altered topic {topic}" in out
    code, _, err = cli(capsys, broker_embedded, "topic", "alter", topic, "--set", "min.insync.replicas=2")
    assert code == 1 and "min.insync.replicas" in err

    code, out, _ = cli(capsys, broker_embedded, "topic", "describe", topic, "-o", "json")
    described = json.loads(out)
    assert code == 0 and [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert described["configs"]["retention.bytes"] == {"value": "1000000", "default": False}
    assert described["configs"]["retention.ms"]["default"] is True
    code, out, _ = cli(capsys, broker_embedded, "topic", "describe", topic)
    assert code == 0 and "PARTITION" in out and "retention.bytes" in out

    code, _, err = cli(capsys, broker_embedded, "topic", "describe", "no-such-topic-cli")
    assert code == 1 and "does not exist" in err and "kafscale topic list" in err

    code, out, err = cli(capsys, broker_embedded, "topic", "delete", topic, "--progress")
    assert code == 0 and f"deleted topic {topic}" in out and "1/1" in err
    code, out, _ = cli(capsys, broker_embedded, "topic", "list", "-o", "json")
    assert topic not in [t["topic"] for t in json.loads(out)]


def test_produce_and_consume(broker_embedded: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic = unique_topic("cli-data")
    assert cli(capsys, broker_embedded, "topic", "create", topic, "-p", "2")[0] == 0

    lines = b"".join(f"key{i % 3}:value {i}\n".encode() for i in range(30))
    done = cli_process(broker_embedded, "produce", topic, "-K", ":", "-H", "source=cli", "--progress", stdin=lines)
    assert done.returncode == 0, done.stderr.decode()
    assert b"produced 30 record(s)" in done.stderr and b"30 (" in done.stderr  # summary and progress bar

    code, out, err = cli(capsys, broker_embedded, "consume", topic, "--from-beginning", "-n", "30", "-o", "json",
                         "--progress")
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(records) == 30 and "30/30" in err
    assert sorted(int(r["value"].split()[1]) for r in records) == list(range(30))
    assert all(r["key"] == f"key{int(r['value'].split()[1]) % 3}" and r["headers"] == [["source", "cli"]]
               for r in records)
    # Same key, same partition; order within a partition is the order produced.
    by_key = {r["key"]: r["partition"] for r in records}
    assert all(r["partition"] == by_key[r["key"]] for r in records)

    done = cli_process(broker_embedded, "produce", topic, "-p", "1", "-k", "fixed", stdin=b"one\ntwo\n")
    assert done.returncode == 0, done.stderr.decode()
    on_1 = sum(r["partition"] == 1 for r in records) + 2  # all it holds: read to the end, however slowly
    code, out, _ = cli(capsys, broker_embedded, "consume", topic, "-p", "1", "--from-beginning", "--print-key",
                       "-n", str(on_1), "--idle-timeout", "60")
    assert code == 0 and len(out.splitlines()) == on_1 and out.splitlines()[-2:] == ["fixed\tone", "fixed\ttwo"]

    # From the end (the default): only what arrives after the consumer started, here nothing.
    code, out, _ = cli(capsys, broker_embedded, "consume", topic, "--idle-timeout", "1")
    assert code == 0 and out == ""

    code, _, err = cli(capsys, broker_embedded, "consume", "no-such-topic-cli2", "-n", "1")
    assert code == 1 and "does not exist" in err
    done = cli_process(broker_embedded, "produce", topic, "-p", "9", stdin=b"x\n")
    assert done.returncode == 1 and b"Unknown partition" in done.stderr and b"Traceback" not in done.stderr


def test_cluster_info_and_unreachable_broker(broker_embedded: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, broker_embedded, "cluster", "info", "-o", "json")
    info = json.loads(out)
    assert code == 0 and info["brokers"] == [{"id": 0, "host": "127.0.0.1", "port": broker_embedded.port}]
    assert info["cluster_id"] and info["controller"] == 0
    code, out, _ = cli(capsys, broker_embedded, "cluster", "info")
    assert code == 0 and "BROKER" in out

    code = main(["cluster", "info", "--bootstrap-server", "127.0.0.1:1", "--timeout", "2"])
    _, err = capsys.readouterr()
    assert code == 1 and "cannot reach a broker at 127.0.0.1:1" in err and "KAFSCALE_BOOTSTRAP_SERVER" in err


def test_resetting_a_live_groups_offsets_is_refused(broker_embedded: Cluster,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka import Consumer

    topic, group = unique_topic("cli-live"), unique_topic("cli-live-g")
    assert cli(capsys, broker_embedded, "topic", "create", topic, "-p", "1")[0] == 0
    consumer = Consumer({"bootstrap.servers": broker_embedded.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        wait_until(lambda: consumer.poll(0.2) is None and consumer.assignment(), what="the member's assignment")
        code, _, err = cli(capsys, broker_embedded, "group", "reset-offsets", group, "-t", topic, "--to-latest",
                           "--execute")
        assert code == 1 and f"reset offsets of '{group}'" in err and "Stop the group's consumers first" in err
    finally:
        consumer.close()


def test_group_commands(broker_embedded: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic, group = unique_topic("cli-group"), unique_topic("cli-g")
    assert cli(capsys, broker_embedded, "topic", "create", topic, "-p", "2")[0] == 0
    done = cli_process(broker_embedded, "produce", topic, "-K", ":", stdin=b"".join(b"k%d:v%d\n" % (i, i)
                                                                                     for i in range(20)))
    assert done.returncode == 0, done.stderr.decode()
    # Consume 12 as a group: its offsets are committed on close.
    code, out, _ = cli(capsys, broker_embedded, "consume", topic, "-g", group, "--from-beginning", "-n", "12")
    assert code == 0 and len(out.splitlines()) == 12

    code, out, _ = cli(capsys, broker_embedded, "group", "list", "-o", "json")
    assert code == 0 and group in [g["group"] for g in json.loads(out)], "ListGroups does not list it"
    code, out, _ = cli(capsys, broker_embedded, "group", "describe", group, "-o", "json")
    described = json.loads(out)
    assert code == 0 and described["state"] == "EMPTY"
    assert sum(o["committed"] for o in described["offsets"]) == 12
    assert all(o["lag"] == o["latest"] - o["committed"] for o in described["offsets"])

    code, out, _ = cli(capsys, broker_embedded, "group", "reset-offsets", group, "-t", topic, "--to-earliest")
    assert code == 0 and "would reset" in out
    code, out, _ = cli(capsys, broker_embedded, "group", "reset-offsets", group, "-t", topic, "--to-earliest",
                       "--execute")
    assert code == 0
    code, out, _ = cli(capsys, broker_embedded, "group", "describe", group, "-o", "json")
    assert {o["committed"] for o in json.loads(out)["offsets"]} == {0}

    code, out, _ = cli(capsys, broker_embedded, "group", "delete", group)
    assert code == 0 and f"deleted group {group}" in out
    code, out, _ = cli(capsys, broker_embedded, "group", "list", "-o", "json")
    assert group not in [g["group"] for g in json.loads(out)]


def test_group_describe_shows_a_consumer_protocol_group_with_its_target_assignment(
        broker_embedded: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """A KIP-848 member (group.protocol=consumer): list says its type, describe its assignor and, per member, its
    epoch, the partitions it owns and its target (equal once reconciled)."""
    from confluent_kafka import Consumer

    topic, group = unique_topic("cli-kip848"), unique_topic("cli-kip848-g")
    assert cli(capsys, broker_embedded, "topic", "create", topic, "-p", "3")[0] == 0
    consumer = Consumer({"bootstrap.servers": broker_embedded.bootstrap, "group.id": group,
                         "group.protocol": "consumer", "group.remote.assignor": "range"})
    try:
        consumer.subscribe([topic])
        wait_until(lambda: consumer.poll(0.2) is None and len(consumer.assignment()) == 3,
                   what="the member's assignment")
        code, out, _ = cli(capsys, broker_embedded, "group", "list", "-o", "json")
        assert code == 0 and {"group": group, "state": "STABLE", "type": "CONSUMER"} in json.loads(out)
        code, out, _ = cli(capsys, broker_embedded, "group", "describe", group, "-o", "json")
        described = json.loads(out)
        assert code == 0 and (described["type"], described["assignor"]) == ("CONSUMER", "range")
        [member] = described["members"]
        assert member["assignment"] == member["target_assignment"] == [[topic, 0], [topic, 1], [topic, 2]]
        assert member["epoch"] == 2  # a group's first member: two group epochs (it joined; the topics it wants)
        code, out, _ = cli(capsys, broker_embedded, "group", "describe", group)
        assert code == 0 and "consumer protocol, assignor range" in out and f"{topic}:0,1,2" in out
    finally:
        consumer.close()
