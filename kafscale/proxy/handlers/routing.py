"""What Produce, Fetch and ListOffsets share: which upstream partition serves a client's partition, and sending
the parts to the upstream leaders, each physical partition at most once per request (Kafka takes one entry per
partition), the answers mapped back to the client's partitions."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.proxy.state import Call
from kafscale.proxy.topics import rounds

Key = tuple[str, int]  # topic, partition


@dataclass(frozen=True, slots=True)
class Target:
    """A client's partition and the upstream partition serving it."""

    topic: str
    partition: int
    physical: int


def place(call: Call, topic: str, partition: int) -> int | ErrorCode:
    """The upstream partition serving a client's partition: itself on a plain topic, its physical partition on
    a virtual one; UNKNOWN_TOPIC_OR_PARTITION beyond the virtual count."""
    layout = call.proxy.topics.layout(topic)
    if layout is None:
        return partition
    if not 0 <= partition < layout.virtual:
        return ErrorCode.unknown_topic_or_partition
    return partition % layout.physical


def split(call: Call, parts: Iterable[tuple[str, int, Any]],
          rewrite: Callable[[Any, int], Any]) -> tuple[dict[Key, Any], list[tuple[Target, Any]]]:
    """(topic, client partition, request part) → the errors of the parts no upstream partition serves, and the
    others with their part rewritten for the upstream partition (`rewrite(part, physical)`)."""
    outcome: dict[Key, Any] = {}
    targets: list[tuple[Target, Any]] = []
    for topic, partition, part in parts:
        physical = place(call, topic, partition)
        if isinstance(physical, ErrorCode):
            outcome[(topic, partition)] = physical
        else:
            targets.append((Target(topic, partition, physical), rewrite(part, physical)))
    return outcome, targets


Send = Callable[[int, list[tuple[Target, Any]], bool], Awaitable[dict[Key, Any]]]


async def forward(call: Call, parts: list[tuple[Target, Any]], send: Send,
                  missing: ErrorCode = ErrorCode.unknown_server_error) -> dict[Key, Any]:
    """`send(leader, parts, first)` for each leader's parts, one physical partition at most once per call; send
    answers {(topic, physical): upstream part}. Rounds go one after another, `first` telling the first: a later
    round only names physical partitions the first named, so only the first may wait for data (a Fetch's
    max_wait), or every round would wait in turn. Returns each client partition's upstream part, or its error
    code: `missing` where the upstream's answer left the partition out."""
    out: dict[Key, Any] = {}
    for index, batch in enumerate(rounds((entry, entry[0].topic, entry[0].physical) for entry in parts)):
        groups: dict[int, list[tuple[Target, Any]]] = defaultdict(list)
        for (target, part), topic, physical in batch:
            node = await call.session.leader(topic, physical)
            if node is None:
                out[(target.topic, target.partition)] = ErrorCode.not_leader_or_follower
            else:
                groups[node].append((target, part))
        sent = list(groups.values())
        answers = await asyncio.gather(*(send(node, group, index == 0) for node, group in groups.items()))
        for group, answer in zip(sent, answers, strict=True):
            for target, _ in group:
                out[(target.topic, target.partition)] = answer.get((target.topic, target.physical), missing)
    return out


def by_topic(parts: list[tuple[Target, Any]]) -> dict[str, list[Any]]:
    """The parts of an upstream request, by topic, in order."""
    topics: dict[str, list[Any]] = {}
    for target, part in parts:
        topics.setdefault(target.topic, []).append(part)
    return topics
