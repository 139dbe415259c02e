"""The Kafka API handlers alone: `handle(broker, ctx, request)` against the fake broker, with no socket, no Ray
and no object store (tests/unit/fake_broker.py). Requests are kio's objects, as the listener would decode them."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

from kafscale.acceptor import dispatch
from kafscale.acceptor.handlers import (
    create_topics,
    delete_records,
    delete_topics,
    describe_configs,
    fetch,
    find_coordinator,
    heartbeat,
    list_offsets,
    metadata,
    offset_commit,
    offset_fetch,
    produce,
)
from kafscale.protocol.codec import decode_response, encode_response, make, request_class
from kafscale.protocol.encoder import encode_request
from kafscale.protocol.errors import ErrorCode
from kafscale.protocol.header import parse_request_header
from kafscale.storage.legacy import Record, message_set
from tests.unit.fake_broker import FakeBroker, context, fake_broker, record_batch


def request(api_key: int, version: int, **fields: Any) -> Any:
    return make(request_class(api_key, version), **fields)


def part(api_key: int, version: int, entity: str, /, **fields: Any) -> Any:
    """A nested request entity (a topic, a partition) of this API version."""
    return make(getattr(sys.modules[request_class(api_key, version).__module__], entity), **fields)


def group_not_coordinated_here(broker: FakeBroker) -> str:
    return next(g for g in (f"group-{i}" for i in range(100)) if broker.placement.coordinator_of(g) != 0)


# ---------------------------------------------------------------------------------------- dispatch


async def test_every_registered_handler_exports_its_range_and_the_router_advertises_exactly_those(
        tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        for module in dispatch.HANDLERS:
            assert callable(module.handle) and 0 <= module.MIN_VERSION <= module.MAX_VERSION, module.__name__
        router = dispatch.build_router(broker)
        advertised = router.supported()
        assert {m.API_KEY: (m.MIN_VERSION, m.MAX_VERSION) for m in dispatch.HANDLERS} == {
            k: v for k, v in advertised.items() if k != 18}
        assert 18 in advertised  # ApiVersions is the router's own


# ---------------------------------------------------------------------------------------- metadata, coordinator


async def test_metadata_advertises_every_shard_and_each_partitions_leader_from_placement(tmp_path: Path) -> None:
    async with fake_broker(tmp_path, shards=3) as broker:
        info = await broker.topics.create("orders", 4, [0, 1, 2])
        answer = await metadata.handle(broker, context(3, 12), request(
            3, 12, topics=(part(3, 12, "MetadataRequestTopic", name="orders", topic_id=None),),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        assert [(b.node_id, b.port) for b in answer.brokers] == [(0, 9092), (1, 9093), (2, 9094)]
        (topic,) = answer.topics
        assert topic.error_code == ErrorCode.none and topic.topic_id == info.id
        assert [p.leader_id for p in topic.partitions] == [broker.placement.leader_of(info, p) for p in range(4)]
        assert len({p.leader_id for p in topic.partitions}) == 3  # spread over the shards


async def test_metadata_creates_an_unknown_topic_only_when_asked(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        def ask(auto: bool) -> Any:
            return request(3, 12, topics=(part(3, 12, "MetadataRequestTopic", name="new", topic_id=None),),
                           allow_auto_topic_creation=auto, include_topic_authorized_operations=False)

        refused = await metadata.handle(broker, context(3, 12), ask(False))
        assert refused.topics[0].error_code == ErrorCode.unknown_topic_or_partition
        created = await metadata.handle(broker, context(3, 12), ask(True))
        assert created.topics[0].error_code == ErrorCode.none
        assert len(created.topics[0].partitions) == broker.config.default_partitions


async def test_find_coordinator_names_the_shard_placement_chooses_in_both_request_shapes(tmp_path: Path) -> None:
    async with fake_broker(tmp_path, shards=3) as broker:
        groups = [f"g{i}" for i in range(6)]
        batched = await find_coordinator.handle(broker, context(10, 4), request(10, 4, key_type=0,
                                                                                coordinator_keys=tuple(groups)))
        assert [(c.key, c.node_id) for c in batched.coordinators] == [
            (g, broker.placement.coordinator_of(g)) for g in groups]
        single = await find_coordinator.handle(broker, context(10, 3), request(10, 3, key="g1", key_type=0))
        assert (single.error_code, single.node_id, single.port) == (
            ErrorCode.none, broker.placement.coordinator_of("g1"), 9092 + broker.placement.coordinator_of("g1"))
        unknown = await find_coordinator.handle(broker, context(10, 3), request(10, 3, key="t", key_type=9))
        assert unknown.error_code == ErrorCode.invalid_request


# ---------------------------------------------------------------------------------------- produce, fetch, offsets


def produce_request(version: int, acks: int, topic: str, records: bytes) -> Any:
    """A Produce request as the listener has it: encoded by a client, read by the handler's own decoder."""
    kio = request(0, version, transactional_id=None, acks=acks, timeout=5000, topic_data=(
        part(0, version, "TopicProduceData", name=topic, partition_data=(
            part(0, version, "PartitionProduceData", index=0, records=records),)),))
    payload = encode_request(kio, correlation_id=7)[4:]
    header = parse_request_header(payload)
    return produce.DECODE(0, version, payload, header.size)


async def test_produce_appends_and_answers_with_the_base_offset(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        for expected in (0, 2):
            answer = await produce.handle(broker, context(0, 9), produce_request(9, -1, "t",
                                                                                   bytes(record_batch(b"a", b"b"))))
            _, decoded = decode_response(0, 9, answer.frame[4:])
            partition = decoded.responses[0].partition_responses[0]
            assert (partition.error_code, partition.base_offset) == (ErrorCode.none, expected)
        assert broker.logs[("t", 0)].end == 4


async def test_produce_refuses_what_it_cannot_store_and_acks_0_gets_no_answer(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        batch = bytes(record_batch(b"x"))
        corrupt = bytearray(message_set(1, 0, [Record(0, 1, None, b"x")]))  # a legacy message (Produce v0-v2)
        corrupt[-1] ^= 1
        for version, acks, records, code in ((2, -1, bytes(corrupt), ErrorCode.corrupt_message),
                                             (9, 2, batch, ErrorCode.invalid_required_acks)):
            answer = await produce.handle(broker, context(0, version), produce_request(version, acks, "t", records))
            _, decoded = decode_response(0, version, answer.frame[4:])
            assert decoded.responses[0].partition_responses[0].error_code == code
        assert await produce.handle(broker, context(0, 9), produce_request(9, 0, "t", batch)) is None
        assert broker.logs[("t", 0)].end == 1  # only the acks=0 request was stored


async def test_fetch_returns_stored_batches_and_names_bad_offsets_and_unknown_topic_ids(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        info = await broker.topics.create("t", 1, [0])
        await broker.produce("t", 0, record_batch(b"a", b"b", b"c"), -1, 1000)

        def ask(topic_id: uuid.UUID, offset: int) -> Any:
            return request(1, 13, replica_id=-1, max_wait=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                           session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="", topics=(
                               part(1, 13, "FetchTopic", topic_id=topic_id, partitions=(
                                   part(1, 13, "FetchPartition", partition=0, current_leader_epoch=-1,
                                        fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1,
                                        partition_max_bytes=1 << 20),)),))

        found = (await fetch.handle(broker, context(1, 13), ask(info.id, 0))).responses[0].partitions[0]
        assert (found.error_code, found.high_watermark) == (ErrorCode.none, 3)
        assert bytes(found.records) == broker.logs[("t", 0)].batches[0][2]
        beyond = (await fetch.handle(broker, context(1, 13), ask(info.id, 9))).responses[0].partitions[0]
        assert beyond.error_code == ErrorCode.offset_out_of_range
        unknown = (await fetch.handle(broker, context(1, 13), ask(uuid.uuid4(), 0))).responses[0].partitions[0]
        assert unknown.error_code == ErrorCode.unknown_topic_id


async def test_produce_and_fetch_at_a_shard_that_does_not_lead_name_the_leader_kip_951(tmp_path: Path) -> None:
    async with fake_broker(tmp_path, shards=3) as broker:
        info = await broker.topics.create("moved", 1, [2])  # led by shard 2; this is shard 0
        answer = await produce.handle(broker, context(0, 11), produce_request(11, -1, "moved",
                                                                              bytes(record_batch(b"x"))))
        _, decoded = decode_response(0, 11, answer.frame[4:])
        partition = decoded.responses[0].partition_responses[0]
        assert partition.error_code == ErrorCode.not_leader_or_follower
        assert (partition.current_leader.leader_id, partition.current_leader.leader_epoch) == (2, 0)
        assert [(n.node_id, n.host, n.port) for n in decoded.node_endpoints] == [(2, "127.0.0.1", 9094)]
        old = await produce.handle(broker, context(0, 9), produce_request(9, -1, "moved", bytes(record_batch(b"y"))))
        assert decode_response(0, 9, old.frame[4:])[1].responses[0].partition_responses[0].error_code == \
            ErrorCode.not_leader_or_follower  # before v10 there is nowhere to name it

        fetched = await fetch.handle(broker, context(1, 16), request(
            1, 16, replica_id=-1, max_wait=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, forgotten_topics_data=(), rack_id="", topics=(
                part(1, 16, "FetchTopic", topic_id=info.id, partitions=(
                    part(1, 16, "FetchPartition", partition=0, current_leader_epoch=-1, fetch_offset=0,
                         last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20),)),)))
        found = fetched.responses[0].partitions[0]
        assert found.error_code == ErrorCode.not_leader_or_follower
        assert (found.current_leader.leader_id, found.current_leader.leader_epoch) == (2, 0)
        assert [(n.node_id, n.port) for n in fetched.node_endpoints] == [(2, 9094)]
        encode_response(7, fetched)  # and it encodes


async def test_list_offsets_and_delete_records_move_the_log_start(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        for value in (b"a", b"b", b"c"):
            await broker.produce("t", 0, record_batch(value), -1, 1000)

        async def offset(timestamp: int) -> int:
            answer = await list_offsets.handle(broker, context(2, 7), request(
                2, 7, replica_id=-1, isolation_level=0, topics=(part(2, 7, "ListOffsetsTopic", name="t", partitions=(
                    part(2, 7, "ListOffsetsPartition", partition_index=0, current_leader_epoch=-1,
                         timestamp=timestamp),)),)))
            return int(answer.topics[0].partitions[0].offset)

        assert (await offset(-2), await offset(-1)) == (0, 3)
        deleted = await delete_records.handle(broker, context(21, 2), request(21, 2, timeout=1000, topics=(
            part(21, 2, "DeleteRecordsTopic", name="t", partitions=(
                part(21, 2, "DeleteRecordsPartition", partition_index=0, offset=2),)),)))
        assert deleted.topics[0].partitions[0].low_watermark == 2
        assert await offset(-2) == 2


# ---------------------------------------------------------------------------------------- topics and configs


async def test_create_topics_refuses_bad_names_duplicates_and_existing_topics(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("taken", 1, [0])

        def topic(name: str) -> Any:
            return part(19, 7, "CreatableTopic", name=name, num_partitions=2, replication_factor=-1, assignments=(),
                        configs=())

        answer = await create_topics.handle(broker, context(19, 7), request(
            19, 7, timeout=1000, validate_only=False, topics=(topic("ok"), topic("bad/name"), topic("taken"),
                                                              topic("twice"), topic("twice"))))
        assert [(t.name, t.error_code) for t in answer.topics] == [
            ("ok", ErrorCode.none), ("bad/name", ErrorCode.invalid_topic_exception),
            ("taken", ErrorCode.topic_already_exists), ("twice", ErrorCode.none),
            ("twice", ErrorCode.invalid_request)]
        assert (await broker.topics.get("ok")).partitions == 2  # type: ignore[union-attr]


async def test_delete_topics_removes_the_topic_and_names_unknown_ones(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("gone", 1, [0])
        answer = await delete_topics.handle(broker, context(20, 6), request(20, 6, timeout=1000, topics=(
            part(20, 6, "DeleteTopicState", name="gone", topic_id=None),
            part(20, 6, "DeleteTopicState", name="never", topic_id=None))))
        assert [(r.name, r.error_code) for r in answer.responses] == [
            ("gone", ErrorCode.none), ("never", ErrorCode.unknown_topic_or_partition)]
        assert await broker.topics.get("gone") is None


async def test_describe_configs_shows_a_topics_own_value_and_the_defaults(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0], {"retention.ms": "1000"})
        answer = await describe_configs.handle(broker, context(32, 4), request(
            32, 4, include_synonyms=False, include_documentation=False, resources=(
                part(32, 4, "DescribeConfigsResource", resource_type=2, resource_name="t",
                     configuration_keys=None),)))
        entries = {c.name: c for c in answer.results[0].configs}
        dynamic_topic, default = 1, 5  # Kafka's ConfigSource
        assert (entries["retention.ms"].value, entries["retention.ms"].config_source) == ("1000", dynamic_topic)
        assert (entries["segment.bytes"].value, entries["segment.bytes"].config_source) == (
            str(broker.config.segment_bytes), default)


# ---------------------------------------------------------------------------------------- groups


async def test_committed_offsets_are_fetched_back_through_the_real_group_registry(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        committed = await offset_commit.handle(broker, context(8, 8), request(
            8, 8, group_id="g", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None, topics=(
                part(8, 8, "OffsetCommitRequestTopic", name="t", partitions=(
                    part(8, 8, "OffsetCommitRequestPartition", partition_index=1, committed_offset=42,
                         committed_leader_epoch=-1, committed_metadata="m"),)),)))
        assert committed.topics[0].partitions[0].error_code == ErrorCode.none
        fetched = await offset_fetch.handle(broker, context(9, 8), request(9, 8, require_stable=False, groups=(
            part(9, 8, "OffsetFetchRequestGroup", group_id="g", topics=(
                part(9, 8, "OffsetFetchRequestTopics", name="t", partition_indexes=(0, 1)),)),)))
        rows = [(p.partition_index, p.committed_offset) for p in fetched.groups[0].topics[0].partitions]
        assert rows == [(0, -1), (1, 42)]


async def test_group_requests_for_a_group_another_shard_coordinates_get_not_coordinator(tmp_path: Path) -> None:
    async with fake_broker(tmp_path, shards=2) as broker:
        elsewhere = group_not_coordinated_here(broker)
        answer = await heartbeat.handle(broker, context(12, 4), request(
            12, 4, group_id=elsewhere, generation_id=1, member_id="m", group_instance_id=None))
        assert answer.error_code == ErrorCode.not_coordinator
        here = next(g for g in (f"group-{i}" for i in range(100)) if broker.placement.coordinator_of(g) == 0)
        unknown = await heartbeat.handle(broker, context(12, 4), request(
            12, 4, group_id=here, generation_id=1, member_id="m", group_instance_id=None))
        assert unknown.error_code == ErrorCode.unknown_member_id


# ---------------------------------------------------------------------------------------- SCRAM credentials


async def test_scram_credentials_are_set_described_and_deleted_with_kafkas_errors(tmp_path: Path) -> None:
    from kafscale.acceptor.handlers import alter_user_scram_credentials as alter
    from kafscale.acceptor.handlers import describe_user_scram_credentials as describe
    from kafscale.security.scram import Mechanism

    def upsert(name: str, mechanism: int, iterations: int = 4096, salt: bytes = b"salt") -> Any:
        return part(51, 0, "ScramCredentialUpsertion", name=name, mechanism=mechanism, iterations=iterations,
                    salt=salt, salted_password=b"salted")

    def deletion(name: str, mechanism: int) -> Any:
        return part(51, 0, "ScramCredentialDeletion", name=name, mechanism=mechanism)

    async with fake_broker(tmp_path) as broker:
        upserts = (upsert("alice", 2), upsert("alice", 1, iterations=8192), upsert("bob", 7),
                   upsert("eve", 1, iterations=100), upsert("", 1), upsert("dan", 1), upsert("dan", 1),
                   upsert("fay", 1, salt=b""))
        answer = await alter.handle(broker, context(51, 0), request(51, 0, deletions=(deletion("carol", 1),),
                                                                     upsertions=upserts))
        assert {r.user: r.error_code for r in answer.results} == {
            "carol": ErrorCode.resource_not_found, "alice": ErrorCode.none, "bob": ErrorCode.unsupported_sasl_mechanism,
            "eve": ErrorCode.unacceptable_credential, "": ErrorCode.unacceptable_credential,
            "dan": ErrorCode.duplicate_resource, "fay": ErrorCode.unacceptable_credential}
        stored = await broker.credentials.stored()
        assert set(stored) == {"alice"} and stored["alice"][Mechanism.SCRAM_SHA_256].iterations == 8192

        answer = await describe.handle(broker, context(50, 0), request(50, 0, users=None))
        (alice,) = answer.results
        assert alice.user == "alice" and [(i.mechanism, i.iterations) for i in alice.credential_infos] == [(1, 8192),
                                                                                                            (2, 4096)]
        answer = await describe.handle(broker, context(50, 0), request(50, 0, users=(
            part(50, 0, "UserName", name="nobody"), part(50, 0, "UserName", name="alice"),
            part(50, 0, "UserName", name="alice"))))
        assert [(r.user, r.error_code) for r in answer.results] == [("nobody", ErrorCode.resource_not_found),
                                                                    ("alice", ErrorCode.duplicate_resource)]

        answer = await alter.handle(broker, context(51, 0), request(51, 0, deletions=(deletion("alice", 1),),
                                                                     upsertions=()))
        assert [r.error_code for r in answer.results] == [ErrorCode.none]
        assert set((await broker.credentials.stored())["alice"]) == {Mechanism.SCRAM_SHA_512}
