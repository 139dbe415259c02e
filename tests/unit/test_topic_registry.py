"""TopicRegistry: every shard's view of the topics, kept by a watch on the metadata store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kafscale.cluster.topics import TopicInfo, TopicRegistry, topic_name_problem
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.keys import MAX_TOPIC_NAME, parse_segment_key, segment_key


async def test_a_resync_after_a_watch_gap_drops_topics_deleted_meanwhile(tmp_path: Path) -> None:
    """Events that happened while the watch was down are lost; the resync must still end with the store's
    view: a topic deleted meanwhile goes (its listeners hear of it), a topic created meanwhile comes."""
    meta = EmbeddedStore(tmp_path / "m.db")
    here, there = TopicRegistry(meta), TopicRegistry(meta)  # this shard's view, another shard's
    await here.start()
    await there.start()
    heard: list[tuple[str, bool]] = []
    here.listeners.append(lambda name, old, new: heard.append((name, new is None)))
    try:
        await there.create("kept", 1, [0])
        await there.create("gone", 1, [0])
        for _ in range(200):
            if {"kept", "gone"} <= set(here.topics):
                break
            await asyncio.sleep(0.01)
        assert {"kept", "gone"} <= set(here.topics)

        await here.stop()  # the watch is down
        assert await there.delete("gone")
        await there.create("new", 2, [0])
        await here.resync()

        assert sorted(here.topics) == ["kept", "new"]
        assert ("gone", True) in heard and ("new", False) in heard
        assert isinstance(here.topics["new"], TopicInfo) and here.topics["new"].partitions == 2
    finally:
        await here.stop()
        await there.stop()
        await meta.close()


def test_one_topic_name_rule_for_requests_and_object_keys() -> None:
    """What CreateTopics/Metadata accept is exactly what the object keys can hold (one copy of the rule)."""
    for name in ["orders", "a.b_c-D9", "x" * MAX_TOPIC_NAME]:
        assert topic_name_problem(name) is None
        assert parse_segment_key(segment_key("ns", name, 0, 0)).topic == name
    for name in ["", ".", "..", "x" * (MAX_TOPIC_NAME + 1), "a/b", "a b", "ä", "orders\n"]:
        assert topic_name_problem(name)
        with pytest.raises(ValueError, match="illegal topic name"):
            segment_key("ns", name, 0, 0)
