"""Listener settings as Kafka spells them (kafscale/listeners.py, BrokerConfig.validate)."""

from __future__ import annotations

import pytest

from kafscale import listeners
from kafscale.config import BrokerConfig, ConfigError
from kafscale.listeners import ListenerError, ListenerSpec


def test_listen_alone_is_one_plaintext_listener() -> None:
    assert listeners.parse("", listen="127.0.0.1:9092") == [ListenerSpec("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)]


def test_names_map_to_protocols_and_advertised_listeners_give_host_and_port() -> None:
    specs = listeners.parse("INTERNAL://{node_ip}:9092,SASL_SSL://0.0.0.0:9094",
                            advertised="SASL_SSL://kafka.example.com:19094",
                            protocol_map="INTERNAL:SASL_PLAINTEXT")
    assert specs == [ListenerSpec("INTERNAL", "SASL_PLAINTEXT", "{node_ip}", 9092),
                     ListenerSpec("SASL_SSL", "SASL_SSL", "0.0.0.0", 9094, "kafka.example.com", 19094)]
    assert [(s.tls, s.sasl) for s in specs] == [(False, True), (True, True)]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"listeners": "PLAINTEXT:/127.0.0.1:9092"}, "NAME://HOST:PORT"),
    ({"listeners": "INTERNAL://127.0.0.1:9092"}, "INTERNAL is no security protocol"),
    ({"listeners": "PLAINTEXT://127.0.0.1"}, "needs a port"),
    ({"listeners": "PLAINTEXT://127.0.0.1:x"}, "not a number"),
    ({"listeners": "PLAINTEXT://a:1,PLAINTEXT://b:2"}, "given twice"),
    ({"listeners": "PLAINTEXT://a:1", "advertised": "SSL://b:2"}, "SSL is not one of the listeners"),
    ({"listeners": "X://a:1", "protocol_map": "X:TLS"}, "PROTOCOL one of"),
])
def test_bad_listener_settings_name_the_setting(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ListenerError, match=message):
        listeners.parse(**kwargs)


def test_the_config_checks_what_listeners_need() -> None:
    with pytest.raises(ConfigError, match="ssl_certfile"):
        BrokerConfig(listeners="SSL://127.0.0.1:9093").validate()
    with pytest.raises(ConfigError, match="sasl_enabled_mechanisms: unknown GSSAPI"):
        BrokerConfig(sasl_enabled_mechanisms="PLAIN,GSSAPI").validate()
    with pytest.raises(ConfigError, match="shard_ports: only with a single listener"):
        BrokerConfig(listeners="PLAINTEXT://a:1,SASL_PLAINTEXT://a:2", shard_ports="1,2").validate()
    config = BrokerConfig(listeners="SASL_PLAINTEXT://127.0.0.1:9095,PLAINTEXT://127.0.0.1:9092").validate()
    assert config.listen_host_port() == ("127.0.0.1", 9095)  # the first listener's: ports go by it
