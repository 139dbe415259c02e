"""A consumer-protocol group as the classic APIs show it (DescribeGroups): members' subscriptions and assignments
in the consumer protocol's embedded format (ConsumerProtocolSubscription and ConsumerProtocolAssignment, version 0),
as Kafka shows them, so tools that only speak DescribeGroups still see who consumes what."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from kafscale.groups.consumer.assignors import Assignment

NULL_BYTES = struct.pack(">i", -1)


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def subscription_bytes(topics: Iterable[str]) -> bytes:
    names = sorted(topics)
    return b"".join([struct.pack(">hi", 0, len(names)), *map(_string, names), NULL_BYTES])


def assignment_bytes(assignment: Assignment) -> bytes:
    parts = [struct.pack(">hi", 0, len(assignment))]
    for topic, partitions in sorted(assignment.items()):
        ps = sorted(partitions)
        parts += [_string(topic), struct.pack(f">i{len(ps)}i", len(ps), *ps)]
    return b"".join([*parts, NULL_BYTES])
