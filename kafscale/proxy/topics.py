"""Which topics the proxy shows as virtual, and where their virtual partitions' committed offsets live.

A virtual topic upstream is a plain topic of P partitions. Its clients see V. Committed offsets cannot stay on the
physical partitions, since the V/P virtual partitions sharing one would overwrite each other's: they go to a
companion topic upstream, `__kafscale-vp-offsets.{topic}`, with V partitions and no data, so the upstream group
coordinator keeps them per virtual partition, durable and fenced by generation like any commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from kafscale.cluster.virtual import VirtualLayout, VirtualMapping

OFFSETS_PREFIX = "__kafscale-vp-offsets."
MAX_TOPIC_NAME = 249
T = TypeVar("T")


def offsets_topic(topic: str) -> str:
    return OFFSETS_PREFIX + topic


def offsets_topic_of(name: str) -> str | None:
    """The virtual topic whose committed offsets a companion topic holds; None for any other name."""
    return name[len(OFFSETS_PREFIX):] if name.startswith(OFFSETS_PREFIX) else None


class VirtualTopics:
    def __init__(self, mapping: VirtualMapping) -> None:
        self.mapping = mapping
        self.offsets_ready: set[str] = set()  # virtual topics whose companion topic is known to exist

    def layout(self, topic: str) -> VirtualLayout | None:
        return self.mapping.layout_for(topic)


def rounds(items: Iterable[tuple[T, str, int]]) -> Iterator[list[tuple[T, str, int]]]:
    """(item, topic, physical partition) grouped into lists that name each physical partition at most once:
    Kafka takes one entry per partition in a Produce, Fetch or ListOffsets request."""
    pending = list(items)
    while pending:
        seen: set[tuple[str, int]] = set()
        now, later = [], []
        for entry in pending:
            key = (entry[1], entry[2])
            (later if key in seen else now).append(entry)
            seen.add(key)
        yield now
        pending = later
