"""DescribeCluster side by side: the cluster operations a client may do, asked for and not (no authorizer on
either broker: Kafka then grants every operation an ACL on the cluster could)."""

from __future__ import annotations

import uuid

from kafscale.protocol import make, request_class
from tests.differential.wire import Peers

DESCRIBE_CLUSTER = 60


def test_describe_cluster_answers_the_authorized_operations_alike(peers: Peers) -> None:
    answers = {}
    for peer in peers:
        answers[peer.name] = [
            (int(a.error_code), int(a.cluster_authorized_operations))
            for a in (peer.call(make(request_class(DESCRIBE_CLUSTER, 1), include_cluster_authorized_operations=wanted,
                                     endpoint_type=1)) for wanted in (False, True))]
    assert answers["kafka"] == answers["kafscale"]
    assert answers["kafka"][0] == (0, -(2**31)) and answers["kafka"][1][1] > 0


def test_metadata_answers_the_authorized_operations_alike(peers: Peers, topic: str) -> None:
    """Metadata v8-v10 carry the cluster's operations, v8+ each topic's (librdkafka's describe_cluster and
    describe_topics ask through it)."""
    answers = {}
    for peer in peers:
        peer.create_ready(topic)
        found = []
        for version in (8, 10, 12):
            for asked in (False, True):
                cls = request_class(3, version)
                module = __import__(cls.__module__, fromlist=["MetadataRequestTopic"])
                entry = make(module.MetadataRequestTopic, name=topic, topic_id=uuid.UUID(int=0))
                answer = peer.call(make(cls, topics=(entry,),
                                        allow_auto_topic_creation=False, include_cluster_authorized_operations=asked,
                                        include_topic_authorized_operations=asked))
                [t] = answer.topics
                found.append((version, asked, int(t.error_code), int(t.topic_authorized_operations),
                              int(getattr(answer, "cluster_authorized_operations", 0))))
        answers[peer.name] = found
    assert answers["kafka"] == answers["kafscale"]
    assert any(ops > 0 for *_, ops, _ in answers["kafka"])
