"""The proxy's handlers against a scripted upstream, no socket: what each translation sends upstream and what the
client gets back (kafscale.proxy.handlers). The records' side is tests/unit/test_proxy_records.py; whole clients
through the proxy are tests/integration/test_proxy.py."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords
from kio.schema.errors import ErrorCode

from kafscale.cluster.virtual import VirtualMapping
from kafscale.protocol.codec import encode_response, make, nested, replace, request_class, response_class
from kafscale.proxy.handlers import fetch, groups, list_offsets, metadata, offsets, produce
from kafscale.proxy.records import tag
from kafscale.proxy.state import Call, Proxy
from kafscale.proxy.topics import VirtualTopics, offsets_topic
from kafscale.proxy.upstream import Cluster, Session
from kafscale.storage.batch import set_base_offset
from tests.unit.test_proxy_records import client_batch


class Scripted(Session):
    """An upstream session whose answers come from `answer(request)`; every request it was sent is kept."""

    def __init__(self, cluster: Cluster, answer: Callable[[Any], Any]) -> None:
        super().__init__(cluster, "test")
        self.answer, self.sent = answer, []
        cluster.versions = {k: (0, 12) for k in range(70)}

    async def send(self, request: Any, node: int | None = None) -> Any:
        self.sent.append(request)
        return self.answer(request)

    async def coordinator(self, group: str, key_type: int = 0) -> int:
        return 1


def call_with(mapping: dict[str, Any], answer: Callable[[Any], Any]) -> tuple[Call, Scripted]:
    cluster = Cluster(("127.0.0.1", 1))
    cluster.brokers[1] = ("127.0.0.1", 1)
    session = Scripted(cluster, answer)
    proxy = Proxy(cluster, VirtualTopics(VirtualMapping.parse({"mapping": mapping})), ("proxy.example", 9192))
    return Call(proxy, session), session


def metadata_answer(topics: dict[str, int], version: int = 12) -> Any:
    cls = response_class(3, version)
    broker, topic_cls, part_cls = (nested(cls, n) for n in ("MetadataResponseBroker", "MetadataResponseTopic",
                                                            "MetadataResponsePartition"))
    return make(cls, throttle_time=0, cluster_id="c", controller_id=1,
                brokers=(make(broker, node_id=1, host="up.example", port=9092, rack=None),),
                topics=tuple(make(topic_cls, error_code=0, name=name, topic_id=None, is_internal=False,
                                  topic_authorized_operations=-2147483648, partitions=tuple(
                                      make(part_cls, error_code=0, partition_index=p, leader_id=1,
                                           leader_epoch=p + 5, replica_nodes=(1,), isr_nodes=(1,), offline_replicas=())
                                      for p in range(count)))
                             for name, count in topics.items()))


def metadata_request(topics: list[str] | None, version: int = 12) -> Any:
    cls = request_class(3, version)
    entries = None if topics is None else tuple(make(nested(cls, "MetadataRequestTopic"), name=t, topic_id=None)
                                                for t in topics)
    return make(cls, topics=entries, allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.sampled_from([1, 4, 9, 12]))
async def test_metadata_shows_v_partitions_each_a_copy_of_its_physical_one_led_by_the_proxy(
        physical: int, ratio: int, version: int) -> None:
    virtual = physical * ratio
    call, _ = call_with({"topics": {"orders": {"physical_partitions": physical, "virtual_partitions": virtual}}},
                        lambda _: metadata_answer({"orders": physical, "plain": 2,
                                                   offsets_topic("orders"): virtual}, version))
    answer = await metadata.handle(call, metadata_request(None, version))
    assert [(b.node_id, b.host, b.port) for b in answer.brokers] == [(0, "proxy.example", 9192)]
    topics = {t.name: t for t in answer.topics}
    assert set(topics) == {"orders", "plain"}, "the companion topic of committed offsets is not listed"
    parts = topics["orders"].partitions
    assert [p.partition_index for p in parts] == list(range(virtual))
    assert all(p.leader_id == 0 and tuple(p.replica_nodes) == (0,) for p in parts)
    if version >= 7:
        assert [p.leader_epoch for p in parts] == [v % physical + 5 for v in range(virtual)]
    assert [p.partition_index for p in topics["plain"].partitions] == [0, 1]
    assert call.proxy.cluster.leaders[("orders", physical - 1)] == 1  # learned for routing


async def test_a_virtual_topic_with_another_count_upstream_is_refused() -> None:
    call, _ = call_with({"topics": {"orders": {"physical_partitions": 4, "virtual_partitions": 8}}},
                        lambda _: metadata_answer({"orders": 3}))
    (topic,) = (await metadata.handle(call, metadata_request(["orders"]))).topics
    assert topic.error_code == ErrorCode.invalid_partitions and topic.partitions == ()


def commit_request(topic: str, partitions: list[int]) -> Any:
    cls = request_class(8, 8)
    topic_cls, part_cls = nested(cls, "OffsetCommitRequestTopic"), nested(cls, "OffsetCommitRequestPartition")
    return make(cls, group_id="g", generation_id_or_member_epoch=1, member_id="m", group_instance_id=None,
                topics=(make(topic_cls, name=topic, partitions=tuple(
                    make(part_cls, partition_index=p, committed_offset=100 + p, committed_leader_epoch=-1,
                         committed_metadata="") for p in partitions)),))


def commit_answer(request: Any) -> Any:
    if request.__api_key__ == 19:  # the companion topic's creation
        cls = response_class(19, request.__version__)
        result = nested(cls, "CreatableTopicResult")
        return make(cls, throttle_time=0, topics=tuple(
            make(result, name=t.name, topic_id=None, error_code=0, error_message=None, topic_config_error_code=0,
                 num_partitions=t.num_partitions, replication_factor=1, configs=()) for t in request.topics))
    cls = response_class(8, request.__version__)
    topic_cls, part_cls = nested(cls, "OffsetCommitResponseTopic"), nested(cls, "OffsetCommitResponsePartition")
    return make(cls, throttle_time=0, topics=tuple(
        make(topic_cls, name=t.name, partitions=tuple(make(part_cls, partition_index=p.partition_index, error_code=0)
                                                      for p in t.partitions)) for t in request.topics))


async def test_a_virtual_partitions_commit_goes_to_its_companion_topic_partition() -> None:
    call, session = call_with({"topics": {"orders": {"physical_partitions": 10, "virtual_partitions": 100}}},
                              commit_answer)
    answer = await offsets.handle(call, commit_request("orders", [57, 99, 100]))
    created, committed = session.sent
    assert [(t.name, t.num_partitions) for t in created.topics] == [(offsets_topic("orders"), 100)]
    (topic,) = committed.topics
    assert topic.name == offsets_topic("orders")
    assert [(p.partition_index, p.committed_offset) for p in topic.partitions] == [(57, 157), (99, 199)]
    (back,) = answer.topics
    assert back.name == "orders"
    assert {p.partition_index: p.error_code for p in back.partitions} == {
        57: ErrorCode.none, 99: ErrorCode.none, 100: ErrorCode.unknown_topic_or_partition}
    await offsets.handle(call, commit_request("orders", [1]))
    assert len(session.sent) == 3, "the companion topic is created once"


async def test_a_plain_topics_commit_passes_unchanged() -> None:
    call, session = call_with({"topics": {"orders": {"physical_partitions": 10, "virtual_partitions": 100}}},
                              commit_answer)
    request = commit_request("plain", [3])
    answer = await offsets.handle(call, request)
    assert session.sent == [request]
    assert dataclasses.asdict(answer.topics[0])["name"] == "plain"


def fetch_request(version: int, topic: str, partitions: list[tuple[int, int]]) -> Any:
    cls = request_class(1, version)
    topic_cls, part_cls = nested(cls, "FetchTopic"), nested(cls, "FetchPartition")
    return make(cls, replica_id=-1, max_wait=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0,
                session_epoch=-1, forgotten_topics_data=(), rack_id="", cluster_id=None,
                topics=(make(topic_cls, topic=topic, topic_id=None, partitions=tuple(
                    make(part_cls, partition=p, fetch_offset=o, partition_max_bytes=1 << 20, log_start_offset=-1,
                         current_leader_epoch=-1, last_fetched_epoch=-1) for p, o in partitions)),))


@pytest.mark.parametrize("version", [4, 6, 7, 11, 12])
async def test_a_fetch_of_any_version_keeps_its_virtual_partitions_batches(version: int) -> None:
    log = bytearray()
    for base, lane in [(0, 3), (2, 13), (4, 3)]:
        batch = bytearray(tag(client_batch([(None, f"{lane}@{base}".encode(), []), (None, b"x", [])]), lane))
        set_base_offset(batch, 0, base)
        log += batch

    def upstream(request: Any) -> Any:
        assert [(t.topic, [p.partition for p in t.partitions]) for t in request.topics] == [("orders", [3])]
        cls = response_class(1, request.__version__)
        topic_cls, part_cls = nested(cls, "FetchableTopicResponse"), nested(cls, "PartitionData")
        return make(cls, throttle_time=0, error_code=0, session_id=0, responses=(make(
            topic_cls, topic="orders", topic_id=None, partitions=(make(
                part_cls, partition_index=3, error_code=0, high_watermark=6, last_stable_offset=6, log_start_offset=0,
                aborted_transactions=(), preferred_read_replica=-1, records=bytes(log)),)),))

    call, session = call_with({"topics": {"orders": {"physical_partitions": 10, "virtual_partitions": 20}}}, upstream)
    call.proxy.cluster.leaders.update({("orders", p): 1 for p in range(10)})  # known: no Metadata asked first
    answer = await fetch.handle(call, fetch_request(version, "orders", [(13, 0)]))
    (part,) = answer.responses[0].partitions
    assert part.partition_index == 13 and part.high_watermark == 6
    batches, values, end = MemoryRecords(part.records), [], 0
    while (b := batches.next_batch()) is not None:
        values += [] if b.is_control_batch else [r.value for r in b]
        end = b.next_offset
    assert values == [b"13@2", b"x"] and end == 6  # lane 3's last batch is stepped over
    assert len(session.sent) == 1


async def test_only_the_first_round_of_a_fetch_waits_for_data() -> None:
    sent_waits = []

    def upstream(request: Any) -> Any:
        sent_waits.append((request.max_wait.total_seconds(), [p.partition for p in request.topics[0].partitions]))
        cls = response_class(1, request.__version__)
        topic_cls, part_cls = nested(cls, "FetchableTopicResponse"), nested(cls, "PartitionData")
        return make(cls, throttle_time=0, error_code=0, session_id=0, responses=(make(
            topic_cls, topic="orders", topic_id=None, partitions=tuple(make(
                part_cls, partition_index=p.partition, error_code=0, high_watermark=0, last_stable_offset=0,
                log_start_offset=0, aborted_transactions=(), preferred_read_replica=-1, records=None)
                for p in request.topics[0].partitions)),))

    call, _ = call_with({"topics": {"orders": {"physical_partitions": 10, "virtual_partitions": 30}}}, upstream)
    call.proxy.cluster.leaders.update({("orders", p): 1 for p in range(10)})
    request = replace(fetch_request(12, "orders", [(3, 0), (13, 0), (23, 0), (4, 0)]), max_wait=datetime.timedelta(
        milliseconds=500))
    answer = await fetch.handle(call, request)
    assert sent_waits == [(0.5, [3, 4]), (0.001, [3]), (0.001, [3])]  # lanes 13 and 23 share physical partition 3
    assert [p.partition_index for p in answer.responses[0].partitions] == [3, 13, 23, 4]
    encode_response(1, answer)


async def test_list_offsets_refuses_a_partition_beyond_v_in_an_answer_that_encodes() -> None:
    call, session = call_with({"topics": {"orders": {"physical_partitions": 10, "virtual_partitions": 30}}},
                              lambda r: None)
    cls = request_class(2, 7)
    topic_cls, part_cls = nested(cls, "ListOffsetsTopic"), nested(cls, "ListOffsetsPartition")
    request = make(cls, replica_id=-1, isolation_level=0, topics=(make(topic_cls, name="orders", partitions=(
        make(part_cls, partition_index=30, current_leader_epoch=-1, timestamp=-1),)),))
    answer = await list_offsets.handle(call, request)
    assert answer.topics[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    assert session.sent == []
    encode_response(1, answer)


@pytest.mark.parametrize("version", [1, 3, 4, 12])
async def test_metadata_creates_a_missing_virtual_topic_with_its_physical_count(version: int) -> None:
    created: list[tuple[str, int]] = []

    def upstream(request: Any) -> Any:
        if request.__api_key__ == 19:
            created.extend((t.name, t.num_partitions) for t in request.topics)
            return commit_answer(request)
        assert getattr(request, "allow_auto_topic_creation", False) is False or created, "asked after creating"
        return metadata_answer({"orders": 10} if created else {}, request.__version__)

    call, _ = call_with({"topics": {"orders": {"physical_partitions": 10, "virtual_partitions": 30}}}, upstream)
    request = metadata_request(["orders"], version)
    if version >= 4:
        request = replace(request, allow_auto_topic_creation=True)
    answer = await metadata.handle(call, request)
    assert created == [("orders", 10), (offsets_topic("orders"), 30)]
    assert len(answer.topics[0].partitions) == 30
    encode_response(1, answer)


async def test_describe_groups_asks_each_groups_coordinator() -> None:
    asked: list[tuple[int | None, list[str]]] = []

    class TwoCoordinators(Scripted):
        async def coordinator(self, group: str, key_type: int = 0) -> int:
            return 1 if group.startswith("a") else 2

        async def send(self, request: Any, node: int | None = None) -> Any:
            asked.append((node, list(request.groups)))
            cls = response_class(15, request.__version__)
            described = nested(cls, "DescribedGroup")
            return make(cls, throttle_time=0, groups=tuple(make(
                described, error_code=0, group_id=g, group_state="Stable", protocol_type="consumer",
                protocol_data="range", members=(), authorized_operations=-2147483648) for g in request.groups))

    call, _ = call_with({}, lambda r: None)
    call.session = TwoCoordinators(call.proxy.cluster, lambda r: None)
    cls = request_class(15, 5)
    answer = await groups.handle(call, make(cls, groups=("a1", "b1", "a2"), include_authorized_operations=False))
    assert sorted(asked) == [(1, ["a1", "a2"]), (2, ["b1"])]
    assert [g.group_id for g in answer.groups] == ["a1", "b1", "a2"]
    encode_response(1, answer)


layouts = st.tuples(st.integers(1, 5), st.integers(1, 4)).map(lambda pr: (pr[0], pr[0] * pr[1]))


@settings(max_examples=60, deadline=None)
@given(layouts, st.data())
async def test_produce_translation_tags_each_virtual_partition_and_answers_it_with_its_physical_offsets(
        layout: tuple[int, int], data: st.DataObject) -> None:
    physical, virtual = layout
    lanes = data.draw(st.lists(st.integers(0, virtual + 1), min_size=1, max_size=8, unique=True))
    upstream_calls: list[list[tuple[int, int | None]]] = []
    next_offset = dict.fromkeys(range(physical), 0)

    def upstream(request: Any) -> Any:
        parts = [(p.index, MemoryRecords(p.records).next_batch()) for t in request.topic_data for p in t.partition_data]
        upstream_calls.append([(index, _tag_of(b)) for index, b in parts])
        cls = response_class(0, request.__version__)
        topic_cls, part_cls = nested(cls, "TopicProduceResponse"), nested(cls, "PartitionProduceResponse")
        answers = []
        for index, _ in parts:
            answers.append(make(part_cls, index=index, error_code=0, base_offset=next_offset[index],
                                log_append_time=None, log_start_offset=0, record_errors=(), error_message=None))
            next_offset[index] += 1
        return make(cls, throttle_time=0, responses=(make(topic_cls, name="orders", partition_responses=tuple(
            answers)),))

    call, _ = call_with({"topics": {"orders": {"physical_partitions": physical, "virtual_partitions": virtual}}},
                        upstream)
    call.proxy.cluster.leaders.update({("orders", p): 1 for p in range(physical)})
    cls = request_class(0, 9)
    topic_cls, part_cls = nested(cls, "TopicProduceData"), nested(cls, "PartitionProduceData")
    request = make(cls, transactional_id=None, acks=-1, timeout=30_000, topic_data=(make(
        topic_cls, name="orders", partition_data=tuple(make(part_cls, index=v, records=client_batch(
            [(None, f"to {v}".encode(), [])])) for v in lanes)),))
    answer = await produce.handle(call, request)
    encode_response(1, answer)
    got = {p.index: p for p in answer.responses[0].partition_responses}
    assert sorted(got) == sorted(lanes)
    for call_parts in upstream_calls:
        indexes = [index for index, _ in call_parts]
        assert len(indexes) == len(set(indexes)), "a physical partition named twice in one request"
        assert all(tag % physical == index for index, tag in call_parts), "a batch in the wrong physical partition"
    sent = sorted(tag for parts in upstream_calls for _, tag in parts)
    assert sent == sorted(v for v in lanes if v < virtual), "each virtual partition's batch, tagged with it, once"
    for v in lanes:
        if v >= virtual:
            assert got[v].error_code == ErrorCode.unknown_topic_or_partition
        else:
            assert got[v].error_code == ErrorCode.none and got[v].base_offset >= 0


def _tag_of(batch: Any) -> int | None:
    (record,) = list(batch)
    key, value = record.headers[0]
    return int(value) if key == "kafscale.vp" else None


@settings(max_examples=40, deadline=None)
@given(layouts, st.data())
async def test_list_offsets_and_commit_translations_name_the_right_upstream_partition(
        layout: tuple[int, int], data: st.DataObject) -> None:
    physical, virtual = layout
    lanes = data.draw(st.lists(st.integers(0, virtual - 1), min_size=1, max_size=6, unique=True))
    asked: list[int] = []

    def upstream(request: Any) -> Any:
        if request.__api_key__ != 2:
            return commit_answer(request)
        asked.extend(p.partition_index for t in request.topics for p in t.partitions)
        cls = response_class(2, request.__version__)
        topic_cls, part_cls = nested(cls, "ListOffsetsTopicResponse"), nested(cls, "ListOffsetsPartitionResponse")
        return make(cls, throttle_time=0, topics=(make(topic_cls, name="orders", partitions=tuple(
            make(part_cls, partition_index=p.partition_index, error_code=0, timestamp=-1,
                 offset=1000 + p.partition_index, leader_epoch=0) for p in request.topics[0].partitions)),))

    call, session = call_with({"topics": {"orders": {"physical_partitions": physical, "virtual_partitions": virtual}}},
                              upstream)
    call.proxy.cluster.leaders.update({("orders", p): 1 for p in range(physical)})
    cls = request_class(2, 7)
    topic_cls, part_cls = nested(cls, "ListOffsetsTopic"), nested(cls, "ListOffsetsPartition")
    answer = await list_offsets.handle(call, make(cls, replica_id=-1, isolation_level=0, topics=(make(
        topic_cls, name="orders", partitions=tuple(make(part_cls, partition_index=v, current_leader_epoch=-1,
                                                        timestamp=-1) for v in lanes)),)))
    assert sorted(asked) == sorted(v % physical for v in lanes)
    assert {p.partition_index: p.offset for p in answer.topics[0].partitions} == {
        v: 1000 + v % physical for v in lanes}, "a virtual partition's offsets are its physical partition's"
    committed = await offsets.handle(call, commit_request("orders", lanes))
    (sent,) = [r for r in session.sent if r.__api_key__ == 8]
    assert [(t.name, sorted(p.partition_index for p in t.partitions)) for t in sent.topics] == [
        (offsets_topic("orders"), sorted(lanes))], "each virtual partition's commit in its own companion partition"
    assert sorted(p.partition_index for p in committed.topics[0].partitions) == sorted(lanes)
