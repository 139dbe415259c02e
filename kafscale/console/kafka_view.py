"""The console's view of the cluster through Kafka's own clients (confluent-kafka), as one principal.

The console is a Kafka client like any other: its client settings (`console_client_config`, a librdkafka
properties file: security.protocol, sasl.*, ssl.*) name the principal it acts as, and the cluster's ACLs decide
what it may see and change. The overview, which no Kafka API answers, comes from the cluster's own layout; the
planned moves, which no Kafka API makes, from the controller, once the principal shows it may ALTER the cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AclOperation,
    AlterConfigOpType,
    ConfigResource,
    ConfigSource,
    NewTopic,
    OffsetSpec,
)
from confluent_kafka.admin import (
    ConfigEntry as KafkaConfigEntry,
)

from kafscale.console import kafka_messages as messages
from kafscale.console import kafka_security as security
from kafscale.console.answers import TIMEOUT_S, answer_of, failed
from kafscale.console.kafka_clients import ConsoleClients
from kafscale.console.view import (
    AclEntry,
    ConfigEntry,
    ConsoleError,
    GroupDetail,
    GroupSummary,
    Member,
    MessagePage,
    PartitionLag,
    PartitionState,
    Placement,
    PlannedMove,
    Produced,
    ResetTo,
    ScramUser,
    TopicDetail,
    TopicStorage,
    TopicSummary,
)


def _source(raw: Any) -> str:
    """librdkafka's config source as Kafka names it (DEFAULT_CONFIG, DYNAMIC_TOPIC_CONFIG, ...)."""
    try:
        return ConfigSource(int(raw)).name
    except (TypeError, ValueError):
        return str(getattr(raw, "name", raw))


class KafkaClusterView:
    def __init__(self, bootstrap: Callable[[], str], client_config: dict[str, str],
                 overview: Callable[[], Awaitable[dict[str, Any]]], placement: Placement | None = None) -> None:
        self.clients = ConsoleClients(bootstrap, client_config)
        self._overview = overview
        self._placement = placement  # None beside a broker without a controller: moves are refused

    @property
    def admin(self) -> Any:
        return self.clients.admin

    def close(self) -> None:
        self.clients.close()

    async def overview(self) -> dict[str, Any]:
        return await self._overview()

    # ---------------------------------------------------------------- topics

    async def _partitions(self, topic: str | None = None) -> dict[str, dict[int, int]]:
        """Topic -> partition -> leader, as Metadata answers (a topic Metadata names with an error left out)."""
        md = await asyncio.to_thread(self.admin.list_topics, topic, TIMEOUT_S)
        found: dict[str, dict[int, int]] = {}
        for name, t in md.topics.items():
            if t.error is not None:
                if topic is not None:
                    raise failed(f"topic {topic!r}", KafkaException(t.error))
                continue
            found[name] = {p: pm.leader for p, pm in t.partitions.items()}
        return found

    async def _offsets(self, parts: list[tuple[str, int]], spec: Any) -> dict[tuple[str, int], int | None]:
        """Each partition's offset, None for one that did not answer (no leader in the middle of a move, or a
        topic deleted since): one partition must not blank the whole page."""
        if not parts:
            return {}
        futures = self.admin.list_offsets({TopicPartition(t, p): spec for t, p in parts},
                                          request_timeout=TIMEOUT_S)
        found: dict[tuple[str, int], int | None] = {}
        for tp, f in futures.items():
            try:
                found[tp.topic, tp.partition] = (await answer_of(f"offsets of {tp.topic}-{tp.partition}", f)).offset
            except ConsoleError as e:
                if e.status == 504:
                    raise
                found[tp.topic, tp.partition] = None
        return found

    async def topics(self) -> list[TopicSummary]:
        found = await self._partitions()
        parts = [(t, p) for t, ps in found.items() for p in ps]
        earliest = await self._offsets(parts, OffsetSpec.earliest())
        latest = await self._offsets(parts, OffsetSpec.latest())
        def readable(name: str, p: int) -> int:
            low, high = earliest[name, p], latest[name, p]
            return 0 if low is None or high is None else high - low

        return [TopicSummary(name, len(ps), sum(readable(name, p) for p in ps), name.startswith("__"))
                for name, ps in sorted(found.items())]

    async def _log_bounds(self, topic: str) -> tuple[dict[int, int], list[tuple[str, int]],
                                                     dict[tuple[str, int], int | None],
                                                     dict[tuple[str, int], int | None]]:
        """A topic's leaders, its partitions, and their earliest and latest offsets (404 if it does not exist)."""
        leaders = (await self._partitions(topic)).get(topic)
        if leaders is None:
            raise ConsoleError(404, f"topic {topic!r} does not exist")
        parts = [(topic, p) for p in sorted(leaders)]
        return (leaders, parts, await self._offsets(parts, OffsetSpec.earliest()),
                await self._offsets(parts, OffsetSpec.latest()))

    async def topic(self, name: str) -> TopicDetail:
        leaders, parts, earliest, latest = await self._log_bounds(name)
        resource = ConfigResource("TOPIC", name)
        entries = await answer_of(f"configs of topic {name!r}", self.admin.describe_configs([resource])[resource])
        configs = [ConfigEntry(e.name, e.value, _source(e.source),
                               bool(e.is_default), bool(e.is_sensitive), bool(e.is_read_only))
                   for e in sorted(entries.values(), key=lambda e: e.name)]
        storage = await self._storage(name)
        return TopicDetail(name, [PartitionState(p, leaders[p], earliest[name, p], latest[name, p],
                                                 storage.sizes.get(p)) for _, p in parts], configs, storage.physical)

    async def _storage(self, topic: str) -> TopicStorage:
        """Sizes and physical partitions, if the console's principal may DESCRIBE the cluster (as DescribeLogDirs
        needs), from the controller; nothing beside a broker without one."""
        if self._placement is None or not await self._may(AclOperation.DESCRIBE):
            return TopicStorage(0, {})
        return await self._placement.topic_storage(topic)

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        fut = self.admin.create_topics([NewTopic(name, partitions, -1, config=configs)],
                                       request_timeout=TIMEOUT_S)[name]
        await answer_of(f"create topic {name!r}", fut)

    async def alter_topic_configs(self, name: str, set_configs: dict[str, str], delete: list[str]) -> None:
        ops = [KafkaConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in set_configs.items()]
        ops += [KafkaConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete]
        resource = ConfigResource("TOPIC", name, incremental_configs=ops)
        await answer_of(f"alter configs of topic {name!r}", self.admin.incremental_alter_configs([resource])[resource])

    async def delete_topic(self, name: str) -> None:
        await answer_of(f"delete topic {name!r}", self.admin.delete_topics([name], request_timeout=TIMEOUT_S)[name])

    # ---------------------------------------------------------------- messages

    async def messages(self, topic: str, partition: int, *, offset: int | None, timestamp: int | None,
                       limit: int) -> MessagePage:
        await self._partition_exists(topic, partition)
        return await asyncio.to_thread(messages.browse, self.clients, topic, partition, offset, timestamp, limit)

    async def produce(self, topic: str, partition: int | None, key: bytes | None, value: bytes | None,
                      headers: list[tuple[str, bytes]]) -> Produced:
        # Looked up first: librdkafka would hold a message for an unknown topic or partition until it times out.
        await self._partition_exists(topic, partition)
        return await messages.produce(self.clients, topic, partition, key, value, headers)

    async def _partition_exists(self, topic: str, partition: int | None) -> None:
        leaders = (await self._partitions(topic)).get(topic, {})
        if partition is not None and partition not in leaders:
            raise ConsoleError(404, f"topic {topic!r} has no partition {partition}")

    # ---------------------------------------------------------------- groups

    async def groups(self) -> list[GroupSummary]:
        listed = await answer_of("list groups", self.admin.list_consumer_groups(request_timeout=TIMEOUT_S))
        ids = sorted(g.group_id for g in listed.valid)
        if not ids:
            return []
        described = self.admin.describe_consumer_groups(ids, request_timeout=TIMEOUT_S)
        found = []
        for gid in ids:
            d = await answer_of(f"describe group {gid!r}", described[gid])
            found.append(GroupSummary(gid, d.state.name if d.state else "UNKNOWN",
                                      getattr(getattr(d, "type", None), "name", "CLASSIC"), len(d.members)))
        return found

    async def _committed(self, group_id: str) -> dict[tuple[str, int], int]:
        futures = self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)],
                                                         request_timeout=TIMEOUT_S)
        answer = await answer_of(f"offsets of group {group_id!r}", futures[group_id])
        return {(tp.topic, tp.partition): tp.offset for tp in answer.topic_partitions if tp.offset >= 0}

    async def _lags(self, committed: dict[tuple[str, int], int]) -> list[PartitionLag]:
        latest = await self._offsets(sorted(committed), OffsetSpec.latest())
        return [PartitionLag(t, p, c, high, None if high is None else max(high - c, 0))
                for (t, p), c in sorted(committed.items()) for high in (latest[t, p],)]

    async def group(self, group_id: str) -> GroupDetail:
        d = await answer_of(f"describe group {group_id!r}",
                          self.admin.describe_consumer_groups([group_id], request_timeout=TIMEOUT_S)[group_id])
        state = d.state.name if d.state else "UNKNOWN"
        if state == "DEAD":
            raise ConsoleError(404, f"group {group_id!r} does not exist")
        members = [Member(m.member_id, m.client_id, m.host, m.group_instance_id,
                          sorted(f"{tp.topic}-{tp.partition}" for tp in (m.assignment.topic_partitions
                                                                         if m.assignment else [])))
                   for m in d.members]
        lags = await self._lags(await self._committed(group_id))
        return GroupDetail(group_id, state, getattr(getattr(d, "type", None), "name", "CLASSIC"),
                           d.partition_assignor or "", d.coordinator.id if d.coordinator else -1, members, lags,
                           sum(o.lag or 0 for o in lags))

    async def reset_offsets(self, group_id: str, topic: str, to: ResetTo, value: int | None) -> list[PartitionLag]:
        _, parts, earliest, latest = await self._log_bounds(topic)
        missing = sorted(p for (_, p) in parts if earliest[topic, p] is None or latest[topic, p] is None)
        if missing:
            raise ConsoleError(503, f"partitions {missing} of {topic!r} did not answer (moving?): try again")
        if to == "timestamp":
            assert value is not None
            at = await self._offsets(parts, OffsetSpec.for_timestamp(value))
            plan = {tp: latest[tp] if at[tp] is None or at[tp] < 0 else at[tp] for tp in parts}
        else:
            plan = {tp: earliest[tp] if to == "earliest" else latest[tp] if to == "latest" else int(value or 0)
                    for tp in parts}
        plan = {tp: min(max(o, earliest[tp]), latest[tp]) for tp, o in plan.items()}  # as Kafka's tool clamps
        request = ConsumerGroupTopicPartitions(group_id, [TopicPartition(t, p, o) for (t, p), o in plan.items()])
        futures = self.admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_S)
        answer = await answer_of(f"reset offsets of group {group_id!r}", futures[group_id])
        # Each partition answers for itself: the future succeeds even when the group refused every offset.
        refused = next((tp.error for tp in answer.topic_partitions if tp.error is not None), None)
        if refused is not None:
            refusal = failed(f"reset offsets of group {group_id!r}", KafkaException(refused))
            if refused.code() in (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS):
                refusal.message += " (the group has members: only an empty group's offsets can be reset)"
            raise refusal
        return await self._lags(plan)

    async def delete_group(self, group_id: str) -> None:
        futures = self.admin.delete_consumer_groups([group_id], request_timeout=TIMEOUT_S)
        await answer_of(f"delete group {group_id!r}", futures[group_id])

    # ---------------------------------------------------------------- security

    async def users(self) -> list[ScramUser]:
        return await security.users(self.admin)

    async def upsert_user(self, name: str, mechanism: str, password: str, iterations: int) -> None:
        await security.upsert_user(self.admin, name, mechanism, password, iterations)

    async def delete_user(self, name: str, mechanism: str) -> None:
        await security.delete_user(self.admin, name, mechanism)

    async def acls(self) -> list[AclEntry]:
        return await security.acls(self.admin)

    async def create_acl(self, entry: AclEntry) -> None:
        await security.create_acl(self.admin, entry)

    async def delete_acl(self, entry: AclEntry) -> int:
        return await security.delete_acl(self.admin, entry)

    # ---------------------------------------------------------------- placement

    async def _controller(self) -> Placement:
        """The controller, once the console's principal shows it may ALTER the cluster: moves are made by the
        controller, not through a Kafka API, so the ACLs are asked first (as kafka-reassign-partitions needs)."""
        if not await self._may(AclOperation.ALTER):
            raise ConsoleError(403, "CLUSTER_AUTHORIZATION_FAILED: the console's principal may not ALTER the "
                                    "cluster, which moving partitions needs")
        if self._placement is None:
            raise ConsoleError(501, "moving partitions needs kafscale serve's controller, which this broker lacks")
        return self._placement

    async def _may(self, operation: AclOperation) -> bool:
        """Whether the console's principal may do this on the cluster (DescribeCluster's authorized operations)."""
        cluster = await answer_of("describe the cluster", self.admin.describe_cluster(
            include_authorized_operations=True, request_timeout=TIMEOUT_S))
        allowed = cluster.authorized_operations or []
        return operation in allowed or AclOperation.ALL in allowed

    async def move_partition(self, topic: str, partition: int, target: int) -> PlannedMove:
        controller = await self._controller()
        try:
            return _planned(await controller.move(topic, partition, target))
        except ValueError as e:
            raise ConsoleError(400, str(e)) from None

    async def drain_node(self, node: str) -> list[PlannedMove]:
        controller = await self._controller()
        try:
            return [_planned(m) for m in await controller.drain(node)]
        except ValueError as e:
            raise ConsoleError(400, str(e)) from None


def _planned(move: dict[str, Any]) -> PlannedMove:
    return PlannedMove(move.get("topic"), move.get("partition"), move.get("group_slot"), move["from"], move["to"],
                       bool(move.get("moved", True)), float(move.get("seconds", 0.0)))
