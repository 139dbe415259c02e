"""Broker settings: defaults < config file < KAFSCALE_* environment < command line, and clear errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kafscale.config import ConfigError, add_arguments, load


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_connection_in_flight_limits_have_their_defaults() -> None:
    config = load(_args(), environ={})
    assert config.max_in_flight_requests == 1000
    assert config.max_in_flight_bytes == 64 * 1024 * 1024


def test_file_then_environment_then_flags_override(tmp_path: Path) -> None:
    path = tmp_path / "kafscale.yaml"
    path.write_text("max_in_flight_requests: 50\nmax-in-flight-bytes: 1000000\nflush_interval_ms: 20\n")
    environ = {"KAFSCALE_CONFIG": str(path), "KAFSCALE_MAX_IN_FLIGHT_BYTES": "2000000"}
    config = load(_args("--flush-interval-ms", "10"), environ=environ)
    assert config.max_in_flight_requests == 50  # file
    assert config.max_in_flight_bytes == 2_000_000  # environment over file
    assert config.flush_interval_ms == 10  # flag over file


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("KAFSCALE_MAX_IN_FLIGHT_BYTES", "0", "max_in_flight_bytes: must be positive, got 0"),
    ("KAFSCALE_MAX_IN_FLIGHT_REQUESTS", "-1", "max_in_flight_requests: must be positive, got -1"),
    ("KAFSCALE_MAX_IN_FLIGHT_REQUESTS", "many", "KAFSCALE_MAX_IN_FLIGHT_REQUESTS: cannot read 'many' as int"),
    ("KAFSCALE_LOG_LEVEL", "LOUD", "log_level: expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'LOUD'"),
    ("KAFSCALE_METRICS_LISTEN", "localhost", "metrics_listen: expected HOST:PORT or '' (off), got 'localhost'"),
    ("KAFSCALE_SHARD_PORTS", "9092,x", "shard_ports: expected comma-separated ports, got '9092,x'"),
    ("KAFSCALE_CONSOLE_LISTEN", "8080", "console_listen: expected HOST:PORT, got '8080' (--no-console turns the "
                                        "console off)"),
    ("KAFSCALE_CONSOLE_CLIENT_CONFIG", "/no/such.properties",
     "console_client_config: no such file '/no/such.properties'"),
    ("KAFSCALE_TRANSACTION_VERSION", "3", "transaction_version: expected 0, 1 or 2, got 3"),
    ("KAFSCALE_LEASE_TTL_S", "0.5", "lease_ttl_s: must lie within 1 and 60 seconds, got 0.5"),
])
def test_bad_values_name_the_setting(name: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(_args(), environ={name: raw})
    assert str(info.value) == message


def test_unknown_key_in_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kafscale.yaml"
    path.write_text("max_inflight: 5\n")
    with pytest.raises(ConfigError, match="unknown setting 'max_inflight'"):
        load(_args("--config", str(path)), environ={})


def test_shard_ports_must_name_one_port_per_shard() -> None:
    with pytest.raises(ConfigError) as info:
        load(_args("--shards", "2", "--shard-ports", "9092"), environ={})
    assert str(info.value) == "shard_ports: 1 ports given for 2 shards per node"


def test_settings_checked_where_used_are_accepted_when_sound() -> None:
    config = load(_args("--log-level", "debug", "--metrics-listen", "", "--shards", "2",
                        "--shard-ports", "9092,9093"), environ={})
    assert (config.log_level, config.metrics_listen, config.shard_port(0), config.shard_port(1)) == (
        "debug", "", 9092, 9093)


def test_shards_on_every_address_take_consecutive_ports_and_advertise_their_node() -> None:
    config = load(_args("--listen", "0.0.0.0:9092", "--shards-per-node", "3"), environ={})
    assert [config.shard_port(k) for k in range(3)] == [9092, 9093, 9094]
    assert config.advertised_for("10.0.0.7") == "10.0.0.7"  # a wildcard bind advertises the node
    assert config.advertised_for("10.0.0.7", label="kafka-7.example") == "kafka-7.example"
    templated = load(_args("--advertised-host", "{node_ip}.nip.io"), environ={})
    assert templated.advertised_for("10.0.0.7") == "10.0.0.7.nip.io"
    assert load(_args(), environ={}).advertised_for("10.0.0.7") == "127.0.0.1"  # bound to loopback
    assert load(_args("--listen", "127.0.0.1:0"), environ={}).shard_port(5) == 0  # any free port


def test_shards_is_an_alias_of_shards_per_node_everywhere(tmp_path: Path) -> None:
    path = tmp_path / "kafscale.yaml"
    path.write_text("shards: 3\n")
    assert load(_args("--config", str(path)), environ={}).shards_per_node == 3
    assert load(_args(), environ={"KAFSCALE_SHARDS": "4"}).shards_per_node == 4
    assert load(_args("--shards", "5"), environ={}).shards_per_node == 5


def test_partitions_per_shard_is_accepted_but_deprecated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "kafscale.yaml"
    path.write_text("partitions_per_shard: 4\n")
    with caplog.at_level("WARNING", logger="kafscale.config"):
        config = load(_args("--config", str(path)), environ={})
    assert config.partitions_per_shard == 4  # an old config file still loads
    assert "partitions_per_shard is deprecated and ignored" in caplog.text
    assert "will be removed" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="kafscale.config"):
        load(_args(), environ={})
    assert "deprecated" not in caplog.text


def test_serve_refuses_a_local_object_store_on_a_multi_node_cluster_unless_it_is_shared() -> None:
    from kafscale.actors.serve import ServeError, check_cluster

    nodes = [{"Alive": True}, {"Alive": True}, {"Alive": False}]
    with pytest.raises(ServeError, match="other nodes cannot read: give --s3-bucket"):
        check_cluster(load(_args(), environ={}), nodes)
    check_cluster(load(_args("--shared-data-dir"), environ={}), nodes)
    check_cluster(load(_args("--s3-bucket", "b"), environ={}), nodes)
    check_cluster(load(_args(), environ={}), nodes[:1])  # one node: the local directory is fine
