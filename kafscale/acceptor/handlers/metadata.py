"""Metadata v0-v12: every live shard is a broker; a partition's leader is the shard placement names.

An answer for all topics is the same for every client until a topic or a shard changes, and at 10,000
partitions building and encoding it holds this shard's event loop (and so its produce path) for ~50 ms.
So the last such frame of each version is kept and only readdressed while the view it was built from
(the topic registry's generation, the shard list, the cluster id) stays the same.
"""

from __future__ import annotations

import contextlib
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import (
    NO_THROTTLE,
    OPERATIONS_NOT_REQUESTED,
    allowed,
    allowed_on_cluster,
    authorized_operations,
    make,
    response_module,
)
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.cluster.topics import TopicExistsError, TopicInfo, topic_name_problem
from kafscale.protocol.codec import encode_response, readdress_response
from kafscale.protocol.produce_codec import EncodedResponse
from kafscale.security.acl import CLUSTER_NAME, Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 3, 0, 12
_ZERO_UUID = uuid.UUID(int=0)


# Per broker: (version, listener name, viewer) -> (the view it shows, the frame). The viewer is the principal and
# its host under an authorizer (each sees the topics it may describe), else None. Weak, so a stopped broker's
# frames go with it; at most FRAMES_KEPT per broker, as principals come and go.
_FrameKey = tuple[int, str, tuple[str, str] | None]
_all_topics_frames: weakref.WeakKeyDictionary[Broker, dict[_FrameKey, tuple[tuple[Any, ...], bytes]]] = (
    weakref.WeakKeyDictionary())
FRAMES_KEPT = 256


async def resolve(broker: Broker, ctx: RequestContext, name: str,
                  auto_create: bool) -> tuple[ErrorCode, TopicInfo | None]:
    if not allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TOPIC, name):
        return ErrorCode.topic_authorization_failed, None  # whether it exists or not, as Kafka answers
    info = await broker.topics.get(name)
    if info is not None:
        return ErrorCode.none, info
    if topic_name_problem(name):
        return ErrorCode.invalid_topic_exception, None
    if not (auto_create and broker.config.auto_create_topics):
        return ErrorCode.unknown_topic_or_partition, None
    if not (allowed_on_cluster(broker, ctx, Operation.CREATE)
            or allowed(broker, ctx, Operation.CREATE, ResourceType.TOPIC, name)):
        return ErrorCode.topic_authorization_failed, None
    layout = broker.topics.layout(name, None, broker.config.default_partitions, {})
    with contextlib.suppress(TopicExistsError):
        await broker.topics.create(name, layout.partitions, broker.placement.accepting_ids(), layout.configs,
                                   physical=layout.physical)
    # Kafka (KRaft) answers UNKNOWN_TOPIC_OR_PARTITION while it creates the topic; ours is usable at once.
    return ErrorCode.none, await broker.topics.get(name)


def partition(broker: Broker, mod: Any, info: TopicInfo, p: int) -> Any:
    """A partition as Kafka shows it: one replica, its leader. A leader whose shard is gone (until the
    controller moves the partition) is LEADER_NOT_AVAILABLE with no leader, so clients wait and ask again."""
    leader = broker.placement.leader_of(info, p)
    epoch = broker.placement.leader_epoch(info, p)
    if not broker.placement.live(leader):
        return make(mod.MetadataResponsePartition, error_code=ErrorCode.leader_not_available, partition_index=p,
                    leader_id=-1, leader_epoch=epoch, replica_nodes=(leader,), isr_nodes=(), offline_replicas=(leader,))
    return make(mod.MetadataResponsePartition, error_code=ErrorCode.none, partition_index=p, leader_id=leader,
                leader_epoch=epoch, replica_nodes=(leader,), isr_nodes=(leader,), offline_replicas=())


@dataclass(frozen=True, slots=True)
class Asked:
    """The authorized operations a Metadata v8+ request asks for (KIP-430): the cluster's (v8-v10), each topic's."""

    cluster: bool = False
    topics: bool = False

    @staticmethod
    def of(req: Any) -> Asked:
        return Asked(bool(getattr(req, "include_cluster_authorized_operations", False)),
                     bool(getattr(req, "include_topic_authorized_operations", False)))


def answer(broker: Broker, ctx: RequestContext, answers: list[tuple[ErrorCode, str | None, TopicInfo | None]],
           asked: Asked = Asked()) -> Any:
    mod = response_module(ctx)
    brokers = tuple(make(mod.MetadataResponseBroker, node_id=s.id, host=host, port=port, rack=None)
                    for s in broker.placement.shards for host, port in (s.on(ctx.listener.name),))
    topics = []
    for code, name, info in answers:
        partitions = ()
        if info is not None:
            partitions = tuple(partition(broker, mod, info, p) for p in range(info.partitions))
        operations = authorized_operations(broker, ctx, ResourceType.TOPIC, name) \
            if asked.topics and info is not None and name is not None else OPERATIONS_NOT_REQUESTED
        topics.append(make(
            mod.MetadataResponseTopic, error_code=code, name=name,
            topic_id=info.id if info else _ZERO_UUID, is_internal=False, partitions=partitions,
            topic_authorized_operations=operations,
        ))
    cluster = authorized_operations(broker, ctx, ResourceType.CLUSTER, CLUSTER_NAME) if asked.cluster \
        else OPERATIONS_NOT_REQUESTED
    return make(mod.MetadataResponse, throttle_time=NO_THROTTLE, brokers=brokers,
                cluster_id=broker.cluster_id, controller_id=0, topics=tuple(topics),
                cluster_authorized_operations=cluster)


def answer_all_topics(broker: Broker, ctx: RequestContext, asked: Asked = Asked()) -> Any:
    """Every topic the client may describe, from a frame kept until the topics, shards or ACLs change."""
    authorizer = broker.acls.authorizer
    viewer = (str(ctx.principal), ctx.client_host) if authorizer is not None else None
    view = (broker.topics.generation, tuple(broker.placement.shards), broker.cluster_id, authorizer)
    frames = _all_topics_frames.setdefault(broker, {})
    key = (ctx.api_version, ctx.listener.name, viewer, asked)
    cached = frames.get(key)
    if cached is not None and cached[0] == view:
        return EncodedResponse(API_KEY, ctx.api_version, readdress_response(cached[1], ctx.correlation_id))
    infos = sorted(broker.topics.topics.values(), key=lambda i: i.name)
    if authorizer is not None:
        infos = [i for i in infos if allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TOPIC, i.name)]
    frame = encode_response(ctx.correlation_id,
                            answer(broker, ctx, [(ErrorCode.none, i.name, i) for i in infos], asked))
    if len(frames) >= FRAMES_KEPT:
        frames.clear()
    frames[key] = (view, bytes(frame))
    return EncodedResponse(API_KEY, ctx.api_version, frame)


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    asked = Asked.of(req)
    if req.topics is None or (ctx.api_version == 0 and not req.topics):
        return answer_all_topics(broker, ctx, asked)
    auto = bool(getattr(req, "allow_auto_topic_creation", True))
    answers: list[tuple[ErrorCode, str | None, TopicInfo | None]] = []
    for t in req.topics:
        name = t.name
        # By id when one is given and no name: the Java client resolving a broker-side regex subscription sends
        # the name as "" (Kafka reads it so too).
        if not name and getattr(t, "topic_id", None) not in (None, _ZERO_UUID):
            info = broker.topics.by_id.get(t.topic_id)
            if info is not None and not allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TOPIC, info.name):
                answers.append((ErrorCode.topic_authorization_failed, None, None))
                continue
            answers.append((ErrorCode.none, info.name, info) if info
                           else (ErrorCode.unknown_topic_id, None, None))
            continue
        code, info = await resolve(broker, ctx, name, auto)
        answers.append((code, name, info))
    return answer(broker, ctx, answers, asked)
