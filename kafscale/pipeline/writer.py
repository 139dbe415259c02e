"""`df.write.format("kafscale")`: produce rows to a topic through the broker, like Spark's Kafka sink.

Rows have a `value` (binary or string) and optionally `key`, `headers` (array of struct<key string,
value binary>), `partition` and `topic` (else the `topic` option). Each task produces with its own
confluent-kafka producer with acks=all and idempotence, and fails unless every record was acknowledged:
a record is durable in the object store once its task has succeeded. Like Spark's Kafka sink this is
at-least-once: a retried task produces its rows again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

__all__ = ["KafscaleWriter"]

_FLUSH_TIMEOUT_S = 120.0


@dataclass
class Produced(WriterCommitMessage):
    records: int


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return str(value).encode()


class KafscaleWriter(DataSourceWriter):
    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        if overwrite:
            raise ValueError("a topic can only be appended to: use mode('append')")
        self.bootstrap = opts.get("kafka.bootstrap.servers") or opts.get("bootstrap.servers")
        if not self.bootstrap:
            raise ValueError("option kafka.bootstrap.servers is required to write to a topic")
        self.topic = opts.get("topic")
        names = set(schema.fieldNames())
        if "value" not in names:
            raise ValueError("rows written to a topic need a 'value' column")
        if self.topic is None and "topic" not in names:
            raise ValueError("give the option topic or a 'topic' column")
        # Other kafka.* options go to the producer, as with Spark's Kafka sink.
        self.producer_config = {k[len("kafka."):]: v for k, v in opts.items()
                                if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}

    def write(self, iterator: Iterator[Row]) -> Produced:
        from confluent_kafka import KafkaException, Producer

        config = {"linger.ms": 5, "compression.type": "lz4", **self.producer_config,
                  "bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True}
        producer = Producer(config)
        errors: list[str] = []
        count = 0

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for row in iterator:
            fields = row.asDict()
            topic = fields.get("topic") or self.topic
            headers = [(h["key"], _bytes(h["value"])) for h in fields.get("headers") or []]
            kwargs: dict[str, Any] = {"value": _bytes(fields["value"]), "key": _bytes(fields.get("key")),
                                      "headers": headers or None, "on_delivery": delivered}
            if fields.get("partition") is not None:
                kwargs["partition"] = int(fields["partition"])
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            producer.poll(0)
            count += 1
        remaining = producer.flush(_FLUSH_TIMEOUT_S)
        if remaining:
            raise KafkaException(f"{remaining} records were not acknowledged within {_FLUSH_TIMEOUT_S:.0f}s")
        if errors:
            raise KafkaException(f"{len(errors)} records failed: {errors[0]}")
        return Produced(count)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # what was acknowledged is in the topic: Kafka has no way to take it back
