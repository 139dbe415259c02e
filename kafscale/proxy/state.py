"""What the proxy's handlers share: the upstream cluster's view, the virtual topics, producer ids, metrics; and
what each request brings, its client's upstream session."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from kafscale.proxy.producers import ProducerIds
from kafscale.proxy.records import Lanes
from kafscale.proxy.topics import VirtualTopics
from kafscale.proxy.upstream import Cluster, Session


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("kafscale_proxy_requests", "Client requests, by API", ["api"], registry=self.registry)
        self.upstream_errors = Counter("kafscale_proxy_upstream_errors", "Client requests failed for want of the "
                                       "upstream (unreachable, no answer)", ["api"], registry=self.registry)
        self.tagged = Counter("kafscale_proxy_produce_tagged", "Produced partitions (their batches) tagged with their "
                                      "virtual partition", registry=self.registry)
        self.batches_kept = Counter("kafscale_proxy_fetch_batches_kept", "Fetched batches passed to a virtual "
                                    "partition's consumer", registry=self.registry)
        self.batches_dropped = Counter("kafscale_proxy_fetch_batches_dropped", "Fetched batches of other virtual "
                                       "partitions left out", registry=self.registry)
        self.refused = Counter("kafscale_proxy_refused", "Requests or partitions refused as untranslatable",
                               ["api"], registry=self.registry)


@dataclass
class Proxy:
    """The state every connection's handlers share."""

    cluster: Cluster
    topics: VirtualTopics
    advertised: tuple[str, int]  # the address clients are told to connect to: the proxy's own
    node_id: int = 0  # the one broker clients see
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    producers: ProducerIds | None = None  # set by the server, which knows how to ask upstream
    lanes: Lanes = field(default_factory=Lanes)


@dataclass
class Call:
    """One client request being served: the shared state and the client's upstream session."""

    proxy: Proxy
    session: Session
