"""One shard, composed: the broker core, the Kafka server in front of it, and operations around it.

The core (kafscale.broker.shard) knows neither the listener nor the metrics: it is handed a metrics sink and
a timed metadata store here, the acceptor is built over it (kafscale.acceptor.dispatch), and operations read its
stats view. The Ray shard actor and the tests' in-process broker both run one of these.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable

from kafscale.acceptor.dispatch import build_router, warm_hot_schemas
from kafscale.acceptor.limits import ConnectionLimits
from kafscale.acceptor.listener import Listener
from kafscale.broker.cleaning import Offload, run_in_thread
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
from kafscale.security.bearer import BearerToken
from kafscale.security.oauthbearer import OAuthBearerExchange, OAuthSettings, TokenValidator
from kafscale.security.sasl import OAUTHBEARER, SaslSettings
from kafscale.security.tls import ServerTls, TlsSettings
from kafscale.storage.metadata_store import MetadataStore
from kafscale.storage.object_store import ObjectStore

log = logging.getLogger(__name__)


class ShardHost:
    def __init__(self, shard_id: int, config: BrokerConfig, *, meta: MetadataStore, objects: ObjectStore,
                 shards: list[ShardAddress] | None = None, peers: Peers | None = None,
                 port: int | None = None, advertised_host: str | None = None, bind_host: str | None = None,
                 node_ip: str = "", open_renewal_store: Callable[[], MetadataStore] | None = None,
                 offload: Offload = run_in_thread) -> None:
        """open_renewal_store: a second connection to the metadata store, for lease renewals on a thread of
        their own (kafscale.cluster.lease_renewal); None renews on the shard's loop."""
        self.shard_id = shard_id
        self.config = config
        self._advertised_host = advertised_host or config.advertised_host or None
        self.metrics = ShardMetrics()
        self.meta = TimedMetadataStore(meta, self.metrics)
        self.renewals = RenewalThread(open_renewal_store) if open_renewal_store and peers is not None else None
        self.core = ShardCore(shard_id, config, meta=self.meta, objects=objects, shards=shards, peers=peers,
                              metrics=self.metrics, renewals=self.renewals, offload=offload)
        self.router = build_router(self.core)
        self.router.observe = self.metrics.observe_request
        mine = self.core.placement.address(shard_id)
        if port is None:
            port = mine.port if mine else config.listen_host_port()[1]
        self.listeners = self._make_listeners(config, port, bind_host, node_ip)
        self.listener = self.listeners[0]  # the first: its port is the shard's in the cluster's records
        self.lag_sampler = LagSampler(self.meta, self.core.stats)
        self.metrics.watch(self.core.stats, lambda: sum(li.connections for li in self.listeners), self.lag_sampler.lags)
        # Busy is measured against the CPUs the shard asked Ray for (--shard-cpus, under --autoscale).
        self.load_meter = LoadMeter(shard_id, self.core.stats, lambda: self.metrics.requests,
                                    cpus=config.shard_cpus if config.autoscale else 1.0)
        self.metrics.registry.register(LoadCollector(self.load_meter))
        self.metrics_server: MetricsServer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _make_listeners(self, config: BrokerConfig, port: int, bind_host: str | None, node_ip: str) -> list[Listener]:
        """One per configured listener: the first at `port` (bind_host, if given, is its host); shard k's
        others at their PORT+k, k read off the first's port (any free port where a listener's PORT is 0)."""
        specs = config.listener_specs()
        first_base = specs[0].port
        settings = TlsSettings(config.ssl_certfile, config.ssl_keyfile, config.ssl_cafile, config.ssl_client_auth,
                               config.ssl_principal_mapping_rules)
        # As in Kafka (KIP-684), ssl_client_auth is for SSL listeners; SASL_SSL ones authenticate by SASL.
        tls = ServerTls(settings) if any(s.tls and not s.sasl for s in specs) else None
        sasl_tls = ServerTls(dataclasses.replace(settings, client_auth="none")) if any(
            s.tls and s.sasl for s in specs) else None
        sasl = sasl_settings(config)
        limits = ConnectionLimits(config.max_connections_per_ip)  # one count over all of this shard's listeners
        made = []
        for i, spec in enumerate(specs):
            if i == 0:
                host, at = bind_host or spec.host.replace("{node_ip}", node_ip or "127.0.0.1"), port
            else:
                host = spec.host.replace("{node_ip}", node_ip or "127.0.0.1")
                at = spec.port + (port - first_base) if spec.port and first_base and port else 0
            made.append(Listener(self.router, host, at, name=spec.name,
                                 max_frame_bytes=config.max_frame_bytes,
                                 advertised_host=self._advertised_host if i == 0 else None,
                                 max_in_flight=config.max_in_flight_requests,
                                 max_in_flight_bytes=config.max_in_flight_bytes,
                                 idle_timeout_s=config.connections_max_idle_ms / 1000,
                                 tls=(sasl_tls if spec.sasl else tls) if spec.tls else None,
                                 sasl=sasl if spec.sasl else None,
                                 credentials=self.core.credentials, limits=limits,
                                 request_read_timeout_s=config.request_read_timeout_ms / 1000,
                                 on_closed=self.metrics.connection_closed))
        self._specs = specs
        self._node_ip = node_ip
        return made

    def advertised_host(self) -> str:
        return self._advertised_host or self.listener.host

    def advertised_listeners(self) -> tuple[tuple[str, str, int], ...]:
        """(name, host, port) clients are told per listener: --advertised-listeners' host (and PORT+k) where
        given, else the listener's own host unless it binds every interface, else the shard's advertised host."""
        out = []
        for spec, listener in zip(self._specs, self.listeners, strict=True):
            host, port = listener.host, listener.port
            if listener is self.listener or host in ("0.0.0.0", "::", ""):
                host = self.advertised_host()
            if spec.advertised_host:
                host = spec.advertised_host.replace("{node_ip}", self._node_ip or "127.0.0.1")
            if spec.advertised_port:
                port = spec.advertised_port + (listener.port - spec.port if spec.port else 0)
            out.append((spec.name, host, port))
        return tuple(out)

    def address(self) -> ShardAddress:
        listeners = self.advertised_listeners()
        _, host, port = listeners[0]
        return ShardAddress(self.shard_id, host, port, listeners)

    async def start(self, node_id: str = "", node_ip: str = "") -> ShardAddress:
        await self.core.start()
        self._node_ip = node_ip or self._node_ip
        for listener in self.listeners:
            await listener.start()
        address = self.address()
        if self.core.placement.lone:
            # Single-shard use (tests, one process): this shard is the whole cluster.
            self.core.placement.shards = [address]
        await self.core.join(BrokerRecord(self.shard_id, address.host, address.port, node_id=node_id,
                                          node_ip=node_ip, pid=os.getpid(), started_ms=int(time.time() * 1000),
                                          listeners=address.listeners))
        log.info("shard %d listening on %s", self.shard_id,
                 ", ".join(f"{li.name} {li.host}:{li.port}" for li in self.listeners))
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self.lag_sampler.run()), loop.create_task(self.load_meter.run()),
                        loop.create_task(warm_hot_schemas())]
        metrics_at = metrics_address(self.config.metrics_listen, self.shard_id)
        if metrics_at is not None:
            c = self.config
            self.metrics_server = MetricsServer(
                self.shard_id, self.metrics.registry, self._readiness_checks, *metrics_at,
                tls=ServerTls(TlsSettings(c.ssl_certfile, c.ssl_keyfile)) if c.metrics_tls else None,
                token=BearerToken(c.metrics_token_file) if c.metrics_token_file else None)
            await self.metrics_server.start()
        return address

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
        await asyncio.gather(*(listener.stop() for listener in self.listeners))
        await self.core.stop()
        if self.renewals is not None:
            await asyncio.to_thread(self.renewals.close)


def sasl_settings(config: BrokerConfig) -> SaslSettings:
    """The SASL listeners' settings. OAUTHBEARER is offered only with a JWKS to check tokens against."""
    mechanisms = config.sasl_mechanisms()
    if not config.sasl_oauthbearer_jwks:
        return SaslSettings(tuple(m for m in mechanisms if m != OAUTHBEARER), config.connections_max_reauth_ms)
    validator = TokenValidator(OAuthSettings(config.sasl_oauthbearer_jwks, config.sasl_oauthbearer_issuer,
                                             config.sasl_oauthbearer_audience, config.sasl_oauthbearer_sub_claim_name,
                                             config.sasl_oauthbearer_clock_skew_s))
    return SaslSettings(tuple(mechanisms), config.connections_max_reauth_ms,
                        oauthbearer=lambda: OAuthBearerExchange(validator))
