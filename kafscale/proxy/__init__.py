"""`kafscale proxy`: virtual partitions (seed 002) in front of any Kafka-compatible cluster.

Clients see V partitions of a topic; the upstream keeps P. The handlers (one per API, kafscale.proxy.handlers)
translate requests and answers; records carry their virtual partition in a header (kafscale.proxy.records);
idempotent producers get an upstream producer id per virtual partition (kafscale.proxy.producers); committed
offsets go to a companion topic (kafscale.proxy.topics). docs/virtual-partitions.md has the whole story.
"""
