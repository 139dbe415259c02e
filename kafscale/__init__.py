"""Kafscale: a Kafka-compatible streaming platform whose source of truth is object storage."""

__version__ = "0.1.0"
