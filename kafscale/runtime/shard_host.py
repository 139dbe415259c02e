"""One shard, composed: the broker core, the Kafka server in front of it, and operations around it.

The core (kafscale.broker.shard) knows neither the listener nor the metrics: it is handed a metrics sink and
a timed metadata store here, the server is built over it (kafscale.server.dispatch), and operations read its
stats view. The Ray shard actor and the tests' in-process broker both run one of these.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from kafscale.broker.interface import Peers
from kafscale.broker.shard import ShardCore
from kafscale.cluster.lease_renewal import RenewalThread
from kafscale.cluster.membership import BrokerRecord
from kafscale.cluster.placement import ShardAddress
from kafscale.config import BrokerConfig
from kafscale.ops.http import MetricsServer, ReadinessChecks, metrics_address
from kafscale.ops.lag import LagSampler
from kafscale.ops.load_meter import LoadCollector, LoadMeter
from kafscale.ops.metrics import ShardMetrics, TimedMetadataStore
from kafscale.server.dispatch import build_router
from kafscale.server.listener import Listener
from kafscale.storage.metadata_store import MetadataStore
from kafscale.storage.object_store import ObjectStore

log = logging.getLogger(__name__)


class ShardHost:
    def __init__(self, shard_id: int, config: BrokerConfig, *, meta: MetadataStore, objects: ObjectStore,
                 shards: list[ShardAddress] | None = None, peers: Peers | None = None,
                 port: int | None = None, advertised_host: str | None = None, bind_host: str | None = None,
                 open_renewal_store: Callable[[], MetadataStore] | None = None) -> None:
        """open_renewal_store: a second connection to the metadata store, for lease renewals on a thread of
        their own (kafscale.cluster.lease_renewal); None renews on the shard's loop."""
        self.shard_id = shard_id
        self.config = config
        self._advertised_host = advertised_host or config.advertised_host or None
        self.metrics = ShardMetrics()
        self.meta = TimedMetadataStore(meta, self.metrics)
        self.renewals = RenewalThread(open_renewal_store) if open_renewal_store and peers is not None else None
        self.core = ShardCore(shard_id, config, meta=self.meta, objects=objects, shards=shards, peers=peers,
                              metrics=self.metrics, renewals=self.renewals)
        self.router = build_router(self.core)
        self.router.observe = self.metrics.observe_request
        host, config_port = config.listen_host_port()
        host = bind_host or host
        mine = self.core.placement.address(shard_id)
        if port is None:
            port = mine.port if mine else config_port
        self.listener = Listener(self.router, host, port,
                                 max_frame_bytes=config.max_frame_bytes,
                                 advertised_host=self._advertised_host,
                                 max_in_flight=config.max_in_flight_requests,
                                 max_in_flight_bytes=config.max_in_flight_bytes,
                                 idle_timeout_s=config.connections_max_idle_ms / 1000)
        self.lag_sampler = LagSampler(self.meta, self.core.stats)
        self.metrics.watch(self.core.stats, lambda: self.listener.connections, self.lag_sampler.lags)
        # Busy is measured against the CPUs the shard asked Ray for (--shard-cpus, under --autoscale).
        self.load_meter = LoadMeter(shard_id, self.core.stats, lambda: self.metrics.requests,
                                    cpus=config.shard_cpus if config.autoscale else 1.0)
        self.metrics.registry.register(LoadCollector(self.load_meter))
        self.metrics_server: MetricsServer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def advertised_host(self) -> str:
        return self._advertised_host or self.listener.host

    async def start(self, node_id: str = "", node_ip: str = "") -> ShardAddress:
        await self.core.start()
        await self.listener.start()
        if self.core.placement.lone:
            # Single-shard use (tests, one process): this shard is the whole cluster.
            self.core.placement.shards = [ShardAddress(self.shard_id, self.advertised_host(), self.listener.port)]
        await self.core.join(BrokerRecord(self.shard_id, self.advertised_host(), self.listener.port, node_id=node_id,
                                          node_ip=node_ip, pid=os.getpid(), started_ms=int(time.time() * 1000)))
        log.info("shard %d listening on %s:%d", self.shard_id, self.listener.host, self.listener.port)
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self.lag_sampler.run()), loop.create_task(self.load_meter.run())]
        address = metrics_address(self.config.metrics_listen, self.shard_id)
        if address is not None:
            self.metrics_server = MetricsServer(self.shard_id, self.metrics.registry, self._readiness_checks,
                                                *address)
            await self.metrics_server.start()
        return ShardAddress(self.shard_id, self.advertised_host(), self.listener.port)

    def _readiness_checks(self) -> ReadinessChecks:
        return ReadinessChecks(listener=(self.listener.host, self.listener.port), metadata_store=self.meta,
                               probe_object_store=self.core.probe_object_store, s3_state=self.core.objects.state)

    async def stop(self) -> None:
        """Stop accepting, flush every owner, release ownership."""
        log.info("shard %d stopping: closing listener", self.shard_id)
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.core.quiesce()
        await self.listener.stop()
        await self.core.stop()
        if self.renewals is not None:
            await asyncio.to_thread(self.renewals.close)
