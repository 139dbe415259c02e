"""Broker settings: one dataclass, filled from defaults < config file < environment < command line.

Every setting is a `kafscale serve` flag (`--flush-interval-ms`), an environment variable
(`KAFSCALE_FLUSH_INTERVAL_MS`) and a key of the optional YAML config file (`flush_interval_ms`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from kafscale import listeners
from kafscale.listeners import ListenerSpec

log = logging.getLogger(__name__)

# Settings still accepted (so existing config files, environments and flags keep working) but no longer read:
# setting one logs a warning. Remove each from BrokerConfig, and from here, in a later release.
DEPRECATED: dict[str, str] = {
    "partitions_per_shard": "partitions_per_shard is deprecated and ignored (placement never read it);"
                            " it will be removed: drop it from your config file, environment or flags",
}


# Other names a setting is known by (flags, environment, config files), for existing scripts.
ALIASES: dict[str, str] = {"shards": "shards_per_node"}


class ConfigError(ValueError):
    """A setting has a value the broker cannot use; the message names the setting."""


@dataclass(slots=True)
class BrokerConfig:
    listen: str = field(default="127.0.0.1:9092", metadata={
        "help": "HOST:PORT every node's shards bind (HOST may be {node_ip}): shard k on an address listens on PORT+k"})
    advertised_host: str = field(default="", metadata={
        "help": "host clients are told to connect to; may hold {node_ip} (default: the bind host, or the node's IP"
                " when binding 0.0.0.0; a Ray node label kafscale-advertised-host wins)"})
    listeners: str = field(default="", metadata={
        "help": "Kafka-style NAME://HOST:PORT,... (names PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, or mapped by"
                " --listener-security-protocol-map); every shard serves each at PORT+k; replaces --listen"})
    advertised_listeners: str = field(default="", metadata={
        "help": "NAME://HOST[:PORT],... what clients are told per listener (HOST may hold {node_ip})"})
    listener_security_protocol_map: str = field(default="", metadata={
        "help": "NAME:PROTOCOL,... for listener names that are not security protocols"})
    ssl_certfile: str = field(default="", metadata={"help": "PEM certificate (chain) of SSL/SASL_SSL listeners"})
    ssl_keyfile: str = field(default="", metadata={"help": "PEM private key (empty: in the certfile)"})
    ssl_cafile: str = field(default="", metadata={"help": "PEM CAs that sign client certificates (mTLS)"})
    ssl_client_auth: str = field(default="none", metadata={
        "help": "client certificates on SSL listeners: none, requested or required"})
    ssl_principal_mapping_rules: str = field(default="DEFAULT", metadata={
        "help": "Kafka's RULE:pattern/replacement/[LU],...,DEFAULT from a certificate's subject to a user name"})
    sasl_enabled_mechanisms: str = field(default="PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER", metadata={
        "help": "SASL mechanisms SASL listeners offer (OAUTHBEARER only with --sasl-oauthbearer-jwks)"})
    sasl_oauthbearer_jwks: str = field(default="", metadata={
        "help": "OAUTHBEARER: the JWKS that signs tokens, a file (reloaded when it changes) or an https:// URL"})
    sasl_oauthbearer_issuer: str = field(default="", metadata={"help": "OAUTHBEARER: the required `iss` claim"})
    sasl_oauthbearer_audience: str = field(default="", metadata={"help": "OAUTHBEARER: an `aud` the token must have"})
    sasl_oauthbearer_sub_claim_name: str = field(default="sub", metadata={
        "help": "OAUTHBEARER: the claim that names the principal"})
    sasl_oauthbearer_clock_skew_s: float = field(default=30.0, metadata={
        "help": "OAUTHBEARER: leeway for the token's exp, nbf and iat"})
    connections_max_reauth_ms: int = field(default=0, metadata={
        "help": "a SASL session lasts at most this long before the client must re-authenticate (0: forever)"})
    request_read_timeout_ms: int = field(default=30_000, metadata={
        "help": "a request must arrive whole within this long of its first byte, or the connection closes (0: no"
                " limit)"})
    max_connections_per_ip: int = field(default=0, metadata={
        "help": "open connections one address may have to a shard, over all its listeners (0: no limit)"})
    authorizer: str = field(default="", metadata={
        "help": "'acl': check every request against ACLs (Create/Describe/DeleteAcls, `kafscale acl`); '': allow all"})
    super_users: str = field(default="", metadata={
        "help": "principals allowed everything under --authorizer acl, ';'-separated (User:admin;User:ops)"})
    allow_everyone_if_no_acl_found: bool = field(default=False, metadata={
        "help": "under --authorizer acl: a resource with no ACL at all is open to everyone (Kafka's option)"})
    shard_ports: str = field(default="", metadata={
        "help": "comma-separated ports for shards 0, 1, ... on each address, instead of PORT+k"})
    data_dir: str = field(default="./data", metadata={"help": "embedded stores live here"})
    s3_endpoint: str = field(default="", metadata={"help": "S3 endpoint URL (empty: AWS)"})
    s3_bucket: str = field(default="", metadata={"help": "S3 bucket; empty = embedded object store"})
    s3_region: str = field(default="us-east-1", metadata={"help": "S3 region"})
    s3_namespace: str = field(default="default", metadata={"help": "key prefix inside the bucket"})
    s3_access_key: str = field(default="", metadata={"help": "S3 access key (else AWS chain)"})
    s3_secret_key: str = field(default="", metadata={"help": "S3 secret key"})
    s3_create_bucket: bool = field(default=True, metadata={"help": "create the bucket if missing"})
    etcd_endpoints: str = field(default="", metadata={"help": "comma-separated; empty = embedded"})
    etcd_prefix: str = field(default="/kafscale/", metadata={"help": "key prefix in etcd"})
    metadata_compaction_interval_s: float = field(default=300.0, metadata={
        "help": "how often the metadata store's revision history is compacted (0: never; see docs/operations.md)"})
    metadata_history_s: float = field(default=600.0, metadata={
        "help": "revision history kept at least this long, for watches to resume"})
    metadata_snapshot_interval_s: float = field(default=3600.0, metadata={
        "help": "how often a snapshot of the metadata goes to the object store (0: never; docs/operations.md)"})
    metadata_snapshots_kept: int = field(default=24, metadata={"help": "the newest snapshots kept; older ones go"})
    shards_per_node: int = field(default=0, metadata={
        "help": "broker shards on every Ray node (0 = the node's CPU count, at least 1); --shards is an alias"})
    shared_data_dir: bool = field(default=False, metadata={
        "help": "--data-dir is one directory shared by every node (NFS...): allow the local object store on a"
                " multi-node cluster"})
    detach: bool = field(default=False, metadata={
        "help": "return once the cluster serves; it runs on until `kafscale cluster stop`"})
    dashboard: bool = field(default=True, metadata={"help": "start the Ray dashboard with a local Ray head"})
    dashboard_port: int = field(default=8265, metadata={"help": "Ray dashboard port (on 127.0.0.1)"})
    console: bool = field(default=True, metadata={
        "help": "serve the web console beside the controller (docs/console.md; login with KAFSCALE_UI_USERNAME and"
                " KAFSCALE_UI_PASSWORD)"})
    console_listen: str = field(default="127.0.0.1:8080", metadata={
        "help": "HOST:PORT of the console (port 0: any); HTTPS with ssl_certfile when that is set"})
    console_client_config: str = field(default="", metadata={
        "help": "librdkafka properties file: how the console connects to the cluster, as which principal"
                " (security.protocol, sasl.*, ssl.*); the ACLs apply to it as to any client"})
    moves_in_flight: int = field(default=4, metadata={"help": "planned partition moves the controller runs at once"})
    autoscale: bool = field(default=False, metadata={
        "help": "the controller sets the number of shards by measured load, between --min-shards and --max-shards"
                " (instead of --shards-per-node on every node)"})
    min_shards: int = field(default=1, metadata={"help": "autoscale: fewest shards (the idle cluster's size)"})
    max_shards: int = field(default=0, metadata={
        "help": "autoscale: most shards (0 = as many as the alive nodes' CPUs fit, at --shard-cpus each)"})
    target_utilization: float = field(default=0.6, metadata={
        "help": "autoscale: the busy fraction (CPU used / CPU allowed) shards should run at"})
    scale_up_delay_s: float = field(default=10.0, metadata={
        "help": "autoscale: how long more shards must be wanted before they are started"})
    scale_down_delay_s: float = field(default=120.0, metadata={
        "help": "autoscale: how long fewer shards must be wanted before one is drained and stopped"})
    shard_cpus: float = field(default=1.0, metadata={
        "help": "autoscale: CPUs each shard asks Ray for (what Ray's autoscaler provisions nodes by)"})
    partitions_per_shard: int = field(default=0, metadata={"help": "deprecated and ignored; will be removed"})
    lease_ttl_s: float = field(default=3.0, metadata={
        "help": "a shard whose lease renewals fail for this long stops serving and its partitions and groups move "
                "(about how long a dead node's work is unserved); raise it on hosts so loaded that renewals stall"})
    flush_interval_ms: int = field(default=50, metadata={
        "help": "max time a record waits to flush while no earlier upload of its partition is running"})
    blocked_flush_min_bytes: int = field(default=0, metadata={
        "help": "a partition whose waiting producers can send nothing more (at Kafka's in-flight limit: 5 acks=all "
                "requests on a connection, or librdkafka's idempotent 5 records on a partition) flushes at once "
                "when it holds this much (0: always); less waits for flush_interval_ms (fewer object-store "
                "requests from slow producers, more latency)"})
    pack_segments: bool = field(default=True, metadata={
        "help": "each shard stores the segments a plain topic's partitions flush in one interval as one object (a "
                "pack): object-store requests follow time, not partitions; off: an object and an index a segment"})
    segment_bytes: int = field(default=4 * 1024 * 1024, metadata={
        "help": "largest segment: the append that would overflow it starts a new one"})
    index_interval_bytes: int = field(default=4096, metadata={"help": "sparse index spacing"})
    cache_bytes: int = field(default=256 * 1024 * 1024, metadata={"help": "segment cache per shard"})
    readahead_segments: int = field(default=1, metadata={"help": "segments prefetched after a miss"})
    max_incremental_fetch_session_cache_slots: int = field(default=1000, metadata={
        "help": "fetch sessions (KIP-227) a shard keeps; 0: none (every fetch names all its partitions)"})
    max_frame_bytes: int = field(default=100 * 1024 * 1024, metadata={"help": "largest request"})
    max_in_flight_requests: int = field(default=1000, metadata={
        "help": "requests read from one connection and not yet answered; beyond that reading pauses"})
    max_in_flight_bytes: int = field(default=64 * 1024 * 1024, metadata={
        "help": "request bytes at which reading pauses (the last request taken may cross it)"})
    connections_max_idle_ms: int = field(default=600_000, metadata={
        "help": "close connections idle this long (Kafka's connections.max.idle.ms); 0 = never"})
    auto_create_topics: bool = field(default=True, metadata={"help": "create topics on first use"})
    default_partitions: int = field(default=1, metadata={"help": "partitions of auto-created topics"})
    virtual_partitions_mapping: str = field(default="", metadata={
        "help": "YAML file naming topics created with virtual partitions (docs/virtual-partitions.md)"})
    max_pending_bytes: int = field(default=64 * 1024 * 1024, metadata={"help": "per-partition unflushed"})
    segment_uploads_in_flight: int = field(default=4, metadata={
        "help": "segments of one partition uploading at once (commits stay in offset order)"})
    s3_degraded_latency_ms: int = field(default=500, metadata={"help": "S3 health: degraded above"})
    s3_unavailable_latency_ms: int = field(default=3000, metadata={"help": "S3 health: unavailable"})
    s3_degraded_error_rate: float = field(default=0.2, metadata={"help": "S3 health: degraded above"})
    s3_unavailable_error_rate: float = field(default=0.6, metadata={"help": "S3 health: unavailable"})
    s3_health_window_s: float = field(default=30.0, metadata={"help": "S3 health sliding window"})
    ray_address: str = field(default="", metadata={"help": "join this Ray cluster (else start one)"})
    metrics_listen: str = field(default="127.0.0.1:9644", metadata={
        "help": "HOST:PORT of the first shard's /metrics /healthz /readyz (shard N: PORT+N; port 0: any; '' off)"})
    metrics_tls: bool = field(default=False, metadata={
        "help": "serve /metrics /healthz /readyz over HTTPS with ssl_certfile and ssl_keyfile (reloaded on change)"})
    metrics_token_file: str = field(default="", metadata={
        "help": "file holding a bearer token that /metrics and /readyz require (re-read when it changes)"})
    retention_check_interval_ms: int = field(default=60_000, metadata={"help": "how often retention runs"})
    log_cleaner_backoff_ms: int = field(default=15_000, metadata={
        "help": "how often each shard looks for compacted partitions due a cleaning (docs/compaction.md)"})
    compaction_map_entries: int = field(default=1_000_000, metadata={
        "help": "keys one cleaning pass maps (about 120 bytes each); more distinct keys are cleaned in passes"})
    janitor_interval_s: float = field(default=600.0, metadata={
        "help": "how often each shard deletes objects no commit refers to or ever will (0: never)"})
    orphan_grace_s: float = field(default=3600.0, metadata={
        "help": "such objects are deleted only this long after they were written"})
    group_initial_rebalance_delay_ms: int = field(default=0, metadata={
        "help": "wait this long for more members when a group starts (Kafka's default 3000; see docs/groups.md)"})
    group_min_session_timeout_ms: int = field(default=6_000, metadata={"help": "shortest consumer session allowed"})
    group_max_session_timeout_ms: int = field(default=1_800_000, metadata={"help": "longest consumer session"})
    group_consumer_session_timeout_ms: int = field(default=45_000, metadata={
        "help": "session of a member of a consumer-protocol group (KIP-848; group.consumer.session.timeout.ms)"})
    group_consumer_min_session_timeout_ms: int = field(default=45_000, metadata={
        "help": "lower bound of group_consumer_session_timeout_ms"})
    group_consumer_max_session_timeout_ms: int = field(default=60_000, metadata={
        "help": "upper bound of group_consumer_session_timeout_ms"})
    group_consumer_heartbeat_interval_ms: int = field(default=5_000, metadata={
        "help": "how often members of a consumer-protocol group heartbeat (told in every heartbeat's answer)"})
    group_consumer_min_heartbeat_interval_ms: int = field(default=5_000, metadata={
        "help": "lower bound of group_consumer_heartbeat_interval_ms"})
    group_consumer_max_heartbeat_interval_ms: int = field(default=15_000, metadata={
        "help": "upper bound of group_consumer_heartbeat_interval_ms"})
    group_consumer_assignors: str = field(default="uniform,range", metadata={
        "help": "server-side assignors members may name (group.remote.assignor); the first is the default"})
    group_consumer_max_size: int = field(default=2_147_483_647, metadata={
        "help": "most members of one consumer-protocol group (GROUP_MAX_SIZE_REACHED beyond)"})
    offsets_retention_minutes: int = field(default=10_080, metadata={"help": "committed offsets of empty groups"})
    offsets_retention_check_interval_ms: int = field(default=600_000, metadata={"help": "offset expiry period"})
    transaction_max_timeout_ms: int = field(default=900_000, metadata={
        "help": "longest transaction timeout InitProducerId may ask for (else INVALID_TRANSACTION_TIMEOUT)"})
    transaction_version: int = field(default=2, metadata={
        "help": "the transaction protocol clients are told to use (ApiVersions' transaction.version feature): 2, "
                "KIP-890 part 2 (the producer epoch bumps with every transaction; Kafka 4 clients then send no "
                "AddPartitionsToTxn), or 1 and 0, the first protocol"})
    transactional_id_expiration_ms: int = field(default=604_800_000, metadata={
        "help": "a transactional id idle this long (no transaction open) is forgotten"})
    producer_id_expiration_ms: int = field(default=86_400_000, metadata={
        "help": "a producer's state in a partition is forgotten once its last batch is this old (no transaction "
                "open there; Kafka's producer.id.expiration.ms)"})
    producer_id_expiration_check_interval_ms: int = field(default=600_000, metadata={
        "help": "how often each shard looks for such producers"})
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING, ERROR"})
    log_json: bool = field(default=False, metadata={"help": "structured JSON logs"})

    def listener_specs(self) -> list[ListenerSpec]:
        try:
            return listeners.parse(self.listeners, self.advertised_listeners, self.listener_security_protocol_map,
                                   self.listen)
        except listeners.ListenerError as e:
            raise ConfigError(str(e)) from None

    def listen_host_port(self) -> tuple[str, int]:
        """The first listener's bind HOST and PORT (the port scheme and health checks go by it)."""
        if self.listeners.strip():
            first = self.listener_specs()[0]
            return first.host, first.port
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"listen: expected HOST:PORT, got {self.listen!r}")
        return host, int(port)

    def shards_on(self, node_cpus: float | None = None) -> int:
        """Shards a node runs: the setting, else its CPU count (at least 1)."""
        if self.shards_per_node > 0:
            return self.shards_per_node
        return max(int(node_cpus if node_cpus is not None else (os.cpu_count() or 1)), 1)

    def shard_port(self, slot: int) -> int:
        """The port of the slot-th shard on an address: shard_ports[slot], else PORT+slot (port 0: any)."""
        _, first = self.listen_host_port()
        ports = self._explicit_ports()
        if ports:
            if slot >= len(ports):
                raise ConfigError(f"shard_ports: {len(ports)} ports given, shard {slot + 1} on one address needs more")
            return ports[slot]
        return first + slot if first else 0

    def _explicit_ports(self) -> list[int]:
        try:
            return [int(p) for p in self.shard_ports.split(",") if p.strip()]
        except ValueError:
            raise ConfigError(f"shard_ports: expected comma-separated ports, got {self.shard_ports!r}") from None

    def advertised_for(self, node_ip: str, label: str = "") -> str:
        """What a shard on a node advertises: the node's label, else --advertised-host (a template), else
        the bind host unless it is a wildcard, else the node's IP."""
        if label:
            return label
        if self.advertised_host:
            return self.advertised_host.replace("{node_ip}", node_ip)
        host = self.bind_host(node_ip)
        return node_ip if host in ("0.0.0.0", "::", "") else host

    def bind_host(self, node_ip: str) -> str:
        """The address a shard on that node listens on: --listen's host, where {node_ip} is the node's IP."""
        host, _ = self.listen_host_port()
        return host.replace("{node_ip}", node_ip)

    def super_user_list(self) -> list[str]:
        return [p.strip() for p in self.super_users.split(";") if p.strip()]

    def sasl_mechanisms(self) -> list[str]:
        return [m.strip().upper() for m in self.sasl_enabled_mechanisms.split(",") if m.strip()]

    def consumer_assignors(self) -> list[str]:
        return [a.strip() for a in self.group_consumer_assignors.split(",") if a.strip()]

    def _validate_consumer_groups(self) -> None:
        """Kafka's checks of the group.consumer.* settings: each default within its bounds, and a heartbeat more
        frequent than the session lasts."""
        for what in ("session_timeout_ms", "heartbeat_interval_ms"):
            low, value, high = (getattr(self, f"group_consumer_{b}{what}") for b in ("min_", "", "max_"))
            if not 0 < low <= value <= high:
                raise ConfigError(f"group_consumer_{what}: must lie within group_consumer_min_{what} and "
                                  f"group_consumer_max_{what} (all positive), got {value} not in [{low}, {high}]")
        if self.group_consumer_heartbeat_interval_ms >= self.group_consumer_session_timeout_ms:
            raise ConfigError(f"group_consumer_heartbeat_interval_ms: must be less than "
                              f"group_consumer_session_timeout_ms, got {self.group_consumer_heartbeat_interval_ms} >= "
                              f"{self.group_consumer_session_timeout_ms}")
        known = {"uniform", "range"}
        if not self.consumer_assignors() or set(self.consumer_assignors()) - known:
            raise ConfigError(f"group_consumer_assignors: expected a comma-separated list of {sorted(known)}, got "
                              f"{self.group_consumer_assignors!r}")
        if self.group_consumer_max_size < 1:
            raise ConfigError(f"group_consumer_max_size: must be positive, got {self.group_consumer_max_size}")

    def etcd_endpoint_list(self) -> list[str]:
        return [e.strip() for e in self.etcd_endpoints.split(",") if e.strip()]

    def validate(self) -> BrokerConfig:
        self.listen_host_port()
        specs = self.listener_specs()
        if any(s.tls for s in specs) and not self.ssl_certfile:
            raise ConfigError("ssl_certfile: the SSL and SASL_SSL listeners need a certificate")
        if self.ssl_client_auth not in ("none", "requested", "required"):
            raise ConfigError(f"ssl_client_auth: expected none, requested or required, got {self.ssl_client_auth!r}")
        unknown = set(self.sasl_mechanisms()) - set(SASL_MECHANISMS)
        if unknown:
            raise ConfigError(f"sasl_enabled_mechanisms: unknown {', '.join(sorted(unknown))} (known: "
                              f"{', '.join(SASL_MECHANISMS)})")
        if self.request_read_timeout_ms < 0 or self.max_connections_per_ip < 0:
            raise ConfigError(f"request_read_timeout_ms and max_connections_per_ip: must be >= 0 (0: no limit), got "
                              f"{self.request_read_timeout_ms} and {self.max_connections_per_ip}")
        self._validate_consumer_groups()
        if self.authorizer not in ("", "acl"):
            raise ConfigError(f"authorizer: expected 'acl' or '' (none), got {self.authorizer!r}")
        if self.transaction_version not in (0, 1, 2):
            raise ConfigError(f"transaction_version: expected 0, 1 or 2, got {self.transaction_version}")
        for principal in self.super_user_list():
            kind, sep, name = principal.partition(":")
            if not sep or not kind or not name:
                raise ConfigError(f"super_users: {principal!r} is not TYPE:NAME (User:admin)")
        if self.max_incremental_fetch_session_cache_slots < 0:
            raise ConfigError("max_incremental_fetch_session_cache_slots: must be >= 0 (0: no fetch sessions), got "
                              f"{self.max_incremental_fetch_session_cache_slots}")
        if self.blocked_flush_min_bytes < 0:
            raise ConfigError(f"blocked_flush_min_bytes: must be >= 0, got {self.blocked_flush_min_bytes}")
        if self.connections_max_reauth_ms < 0:
            raise ConfigError(f"connections_max_reauth_ms: must be >= 0, got {self.connections_max_reauth_ms}")
        if len(specs) > 1 and self._explicit_ports():
            raise ConfigError("shard_ports: only with a single listener (with several, shard k serves each at PORT+k)")
        for name in ("flush_interval_ms", "segment_bytes", "cache_bytes", "max_frame_bytes", "default_partitions",
                     "segment_uploads_in_flight", "max_in_flight_requests", "max_in_flight_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be positive, got {getattr(self, name)}")
        if not 1.0 <= self.lease_ttl_s <= 60.0:
            raise ConfigError(f"lease_ttl_s: must lie within 1 and 60 seconds, got {self.lease_ttl_s}")
        if self.shards_per_node < 0:
            raise ConfigError(f"shards_per_node: must be >= 0, got {self.shards_per_node}")
        if self.moves_in_flight <= 0:
            raise ConfigError(f"moves_in_flight: must be positive, got {self.moves_in_flight}")
        if self.min_shards < 1:
            raise ConfigError(f"min_shards: must be at least 1, got {self.min_shards}")
        if self.max_shards and self.max_shards < self.min_shards:
            raise ConfigError(f"max_shards: must be 0 (as many as fit) or at least min_shards ({self.min_shards}),"
                              f" got {self.max_shards}")
        if not 0 < self.target_utilization <= 1:
            raise ConfigError(f"target_utilization: must be in (0, 1], got {self.target_utilization}")
        if self.scale_up_delay_s < 0 or self.scale_down_delay_s < 0:
            raise ConfigError(f"scale_up_delay_s and scale_down_delay_s: must be >= 0, got {self.scale_up_delay_s}"
                              f" and {self.scale_down_delay_s}")
        if self.shard_cpus <= 0:
            raise ConfigError(f"shard_cpus: must be positive, got {self.shard_cpus}")
        if self.connections_max_idle_ms < 0:
            raise ConfigError(f"connections_max_idle_ms: must be >= 0 (0 = never), got {self.connections_max_idle_ms}")
        ports = self._explicit_ports()
        if ports and self.shards_per_node > len(ports):
            raise ConfigError(f"shard_ports: {len(ports)} ports given for {self.shards_per_node} shards per node")
        if self.metrics_listen:
            _, _, port = self.metrics_listen.rpartition(":")
            if not port.isdigit():
                raise ConfigError(f"metrics_listen: expected HOST:PORT or '' (off), got {self.metrics_listen!r}")
        if self.console:
            _, colon, port = self.console_listen.rpartition(":")
            if not colon or not port.isdigit():
                raise ConfigError(f"console_listen: expected HOST:PORT, got {self.console_listen!r} "
                                  "(--no-console turns the console off)")
        if self.console_client_config and not os.path.isfile(self.console_client_config):
            raise ConfigError(f"console_client_config: no such file {self.console_client_config!r}")
        if self.metadata_snapshot_interval_s < 0 or self.metadata_snapshots_kept < 1:
            raise ConfigError("metadata_snapshot_interval_s must not be negative, metadata_snapshots_kept at least 1")
        if self.log_cleaner_backoff_ms <= 0 or self.compaction_map_entries <= 0:
            raise ConfigError("log_cleaner_backoff_ms and compaction_map_entries must be positive")
        if self.producer_id_expiration_ms <= 0 or self.producer_id_expiration_check_interval_ms <= 0:
            raise ConfigError("producer_id_expiration_ms and producer_id_expiration_check_interval_ms must be "
                              "positive")
        if self.janitor_interval_s < 0 or self.orphan_grace_s < 0:
            raise ConfigError("janitor_interval_s and orphan_grace_s must not be negative")
        if self.metadata_compaction_interval_s < 0 or self.metadata_history_s < 0:
            raise ConfigError("metadata_compaction_interval_s and metadata_history_s must not be negative")
        if self.metrics_tls and not self.ssl_certfile:
            raise ConfigError("metrics_tls: the HTTPS endpoint needs ssl_certfile (and ssl_keyfile)")
        if self.virtual_partitions_mapping and not os.path.isfile(self.virtual_partitions_mapping):
            raise ConfigError(f"virtual_partitions_mapping: no such file {self.virtual_partitions_mapping!r}")
        if self.metrics_token_file and not os.path.isfile(self.metrics_token_file):
            raise ConfigError(f"metrics_token_file: no such file {self.metrics_token_file!r}")
        if self.log_level.upper() not in _LOG_LEVELS:
            raise ConfigError(f"log_level: expected one of {', '.join(_LOG_LEVELS)}, got {self.log_level!r}")
        return self


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _coerce(name: str, kind: type, raw: Any) -> Any:
    if isinstance(raw, kind) and not (kind is int and isinstance(raw, bool)):
        return raw
    text = str(raw).strip()
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        return kind(text)
    except ValueError:
        raise ConfigError(f"{name}: cannot read {raw!r} as {kind.__name__}") from None


_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


def _field_types() -> dict[str, type]:
    return {f.name: _TYPES[f.type] if isinstance(f.type, str) else f.type for f in fields(BrokerConfig)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; defaults are None so that only flags actually given override."""
    parser.add_argument("--config", help="YAML file with settings (keys as the flags, with underscores)")
    types = _field_types()
    for f in fields(BrokerConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = types[f.name]
        env = "KAFSCALE_" + f.name.upper()
        help_text = f"{f.metadata.get('help', '')} [env {env}; default {f.default!r}]"
        if kind is bool:
            parser.add_argument(flag, dest=f.name, default=None, action=argparse.BooleanOptionalAction,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, default=None, help=help_text)
    for alias, name in ALIASES.items():
        parser.add_argument("--" + alias.replace("_", "-"), dest=name, default=None, help=f"same as --{name}")


def load(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> BrokerConfig:
    """Precedence, lowest to highest: defaults, config file, KAFSCALE_* environment, command line."""
    environ = dict(os.environ if environ is None else environ)
    types = _field_types()
    values: dict[str, Any] = {}
    config_path = getattr(args, "config", None) or environ.get("KAFSCALE_CONFIG")
    if config_path:
        path = Path(config_path)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"config: cannot read {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config: {path} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config: {path} must hold a mapping of settings")
        for key, raw in loaded.items():
            name = str(key).replace("-", "_")
            name = ALIASES.get(name, name)
            if name not in types:
                raise ConfigError(f"config: unknown setting {key!r} in {path}")
            values[name] = _coerce(name, types[name], raw)
    for alias, name in ALIASES.items():
        env = "KAFSCALE_" + alias.upper()
        if env in environ:
            values[name] = _coerce(env, types[name], environ[env])
    for name, kind in types.items():
        env = "KAFSCALE_" + name.upper()
        if env in environ:
            values[name] = _coerce(env, kind, environ[env])
    if args is not None:
        for name, kind in types.items():
            raw = getattr(args, name, None)
            if raw is not None:
                values[name] = _coerce("--" + name.replace("_", "-"), kind, raw)
    for name in values.keys() & DEPRECATED.keys():
        log.warning(DEPRECATED[name])
    return dataclasses.replace(BrokerConfig(), **values).validate()
