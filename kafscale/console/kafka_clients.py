"""The console's Kafka clients: one admin client and one producer, made for the cluster's current addresses.

The controller hands over the live shards' addresses as they are now. A client made before any shard was live
would have no broker to ask, ever; one made for addresses since gone would follow the cluster's metadata, but
not if every shard it knew moved. So the clients are made again whenever the addresses change.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kafscale.console.view import ConsoleError

PRODUCER_TIMEOUT_MS = 15_000


def read_client_config(path: str) -> dict[str, str]:
    """A librdkafka properties file: `key=value` lines, `#` comments."""
    settings: dict[str, str] = {}
    if not path:
        return settings
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}:{number}: expected key=value, got {line!r}")
        settings[key.strip()] = value.strip()
    return settings


class ConsoleClients:
    def __init__(self, bootstrap: Callable[[], str], client_config: dict[str, str]) -> None:
        self._bootstrap = bootstrap
        self._client_config = client_config
        self._made_for = ""
        self._admin: AdminClient | None = None
        self._producer: Producer | None = None

    def settings(self, **extra: Any) -> dict[str, Any]:
        servers = self._bootstrap()
        if not servers:
            raise ConsoleError(503, "no shard of the cluster is live yet: try again in a moment")
        # Never auto-created: looking at a topic that is not there (or was just deleted) must not make it.
        return {"bootstrap.servers": servers, "client.id": "kafscale-console", "allow.auto.create.topics": False,
                **self._client_config, **extra}

    def _current(self) -> None:
        servers = self._bootstrap()
        if servers != self._made_for:
            self._admin = self._producer = None  # dropped clients end their own threads
            self._made_for = servers

    @property
    def admin(self) -> AdminClient:
        self._current()
        if self._admin is None:
            self._admin = AdminClient(self.settings())
        return self._admin

    @property
    def producer(self) -> Producer:
        self._current()
        if self._producer is None:
            self._producer = Producer(self.settings(**{"linger.ms": 0, "message.timeout.ms": PRODUCER_TIMEOUT_MS}))
        return self._producer

    def close(self) -> None:
        """Blocks up to 5 s for a test message still in flight: call it from a thread."""
        if self._producer is not None:
            self._producer.flush(5)
        self._admin = self._producer = None
