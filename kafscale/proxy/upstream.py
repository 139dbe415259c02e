"""The proxy's side of the upstream cluster: connections to its brokers, and what it knows of them.

`Cluster` is the one shared view: the brokers, each partition's leader and count, each group's coordinator, the
API versions the upstream speaks. Every handler learns from the answers it forwards, and asks again (Metadata,
FindCoordinator) only for what it does not know.

A `Session` belongs to one client connection and holds that client's connections upstream, one per broker:
Kafka serves one request per connection at a time, so a client's long-polling Fetch must not hold up
another client's Produce on a shared connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import logging
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import decode_response, encode_request, make, nested, request_class

log = logging.getLogger(__name__)
_SIZE = struct.Struct(">i")
MAX_FRAME = 256 * 1024 * 1024
METADATA_VERSION = 9  # the versions of the requests the proxy makes itself (capped by what upstream speaks)
FIND_COORDINATOR_VERSION = 3
INIT_PRODUCER_ID_VERSION = 3
CREATE_TOPICS_VERSION = 4
API_VERSIONS_VERSION = 2
UPSTREAM_MARGIN_S = 30.0  # beyond the longest wait a request allows, before the upstream counts as gone


class UpstreamError(Exception):
    """The upstream broker could not be reached or answered nonsense: the client's request fails."""


class _Connection:
    """One TCP connection and the requests waiting for its answers; a new one replaces it when it breaks."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.pending: dict[int, tuple[int, int, asyncio.Future[Any]]] = {}
        self.task: asyncio.Task[None] | None = None

    def fail(self, error: Exception) -> None:
        pending, self.pending = self.pending, {}
        for _, _, future in pending.values():
            if not future.done():
                future.set_exception(error)
        self.writer.close()


class Link:
    """One connection to one upstream broker: requests pipelined, answers matched by correlation id."""

    def __init__(self, host: str, port: int, client_id: str | None) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self._connection: _Connection | None = None
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    async def send(self, request: Any, timeout: float) -> Any:
        """The upstream's answer to `request`, a kio request object."""
        async with self._lock:
            connection = await self._connected()
            correlation_id = next(self._ids) & 0x7FFFFFFF
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            connection.pending[correlation_id] = (request.__api_key__, request.__version__, future)
            try:
                connection.writer.write(encode_request(request, correlation_id, self.client_id))
                await connection.writer.drain()
            except (OSError, asyncio.CancelledError) as e:
                connection.pending.pop(correlation_id, None)
                future.cancel()
                if isinstance(e, asyncio.CancelledError):
                    raise
                raise UpstreamError(f"cannot send to upstream {self.host}:{self.port}: {e}") from None
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            connection.fail(UpstreamError("timed out"))  # an answer may still come: its order is lost, start afresh
            raise UpstreamError(f"{self.host}:{self.port} did not answer in {timeout:.0f} s") from None

    async def send_only(self, request: Any) -> None:
        """Send a request the upstream does not answer (a Produce with acks=0)."""
        async with self._lock:
            connection = await self._connected()
            try:
                connection.writer.write(encode_request(request, next(self._ids) & 0x7FFFFFFF, self.client_id))
                await connection.writer.drain()
            except OSError as e:
                raise UpstreamError(f"cannot send to upstream {self.host}:{self.port}: {e}") from None

    async def _connected(self) -> _Connection:
        if self._connection is not None and not self._connection.writer.is_closing():
            return self._connection
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 10)
        except (OSError, TimeoutError) as e:
            raise UpstreamError(f"cannot connect to upstream {self.host}:{self.port}: {e}") from None
        connection = self._connection = _Connection(reader, writer)
        connection.task = asyncio.get_running_loop().create_task(self._read(connection))
        return connection

    async def _read(self, connection: _Connection) -> None:
        error: Exception = UpstreamError(f"upstream {self.host}:{self.port} closed the connection")
        try:
            while True:
                (size,) = _SIZE.unpack(await connection.reader.readexactly(4))
                if not 4 <= size <= MAX_FRAME:
                    raise UpstreamError(f"upstream {self.host}:{self.port} sent a frame of {size} bytes")
                payload = await connection.reader.readexactly(size)
                (correlation_id,) = _SIZE.unpack_from(payload, 0)
                api_key, version, future = connection.pending.pop(correlation_id, (0, 0, None))
                if future is None:
                    raise UpstreamError(f"upstream {self.host}:{self.port} answered an unknown request")
                if not future.done():
                    try:
                        future.set_result(decode_response(api_key, version, payload)[1])
                    except Exception as e:
                        future.set_exception(UpstreamError(f"undecodable answer from {self.host}:{self.port}: {e}"))
        except UpstreamError as e:
            error = e
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:  # cancelled too: whoever waits on this connection hears of it
            connection.fail(error)

    def close(self) -> None:
        if self._connection is not None:
            if self._connection.task is not None:
                self._connection.task.cancel()
            self._connection.fail(UpstreamError("connection closed"))
            self._connection = None


def timeout_for(request: Any) -> float:
    """How long to wait for the upstream's answer: a margin over the longest wait the request itself allows (a
    JoinGroup's rebalance timeout, a Fetch's max_wait, a Produce's or CreateTopics' timeout)."""
    longest = 0.0
    for name in ("rebalance_timeout", "session_timeout", "max_wait", "timeout"):
        value = getattr(request, name, None)
        if isinstance(value, datetime.timedelta):
            longest = max(longest, value.total_seconds())
        elif isinstance(value, int):
            longest = max(longest, value / 1000)
    return UPSTREAM_MARGIN_S + longest


@dataclass
class Cluster:
    """What the proxy knows of the upstream cluster, shared by every session."""

    bootstrap: tuple[str, int]
    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)
    leaders: dict[tuple[str, int], int] = field(default_factory=dict)
    partition_counts: dict[str, int] = field(default_factory=dict)
    coordinators: dict[str, int] = field(default_factory=dict)
    versions: dict[int, tuple[int, int]] = field(default_factory=dict)  # upstream's ApiVersions

    def version(self, api_key: int, preferred: int) -> int:
        """The version of a request the proxy makes: `preferred`, or the highest the upstream speaks below."""
        lo, hi = self.versions.get(api_key, (0, preferred))
        return max(lo, min(hi, preferred))

    def learn(self, metadata: Any) -> None:
        """Take in a Metadata answer: brokers (all of them: one gone is forgotten), partition counts and leaders
        (a topic the upstream does not know any more is forgotten)."""
        if metadata.brokers:
            self.brokers = {b.node_id: (b.host, b.port) for b in metadata.brokers}
        for topic in metadata.topics:
            if topic.error_code == ErrorCode.unknown_topic_or_partition and topic.name is not None:
                self.partition_counts.pop(topic.name, None)
            if topic.error_code != 0 or topic.name is None:
                continue
            self.partition_counts[topic.name] = len(topic.partitions)
            for p in topic.partitions:
                self.leaders[(topic.name, p.partition_index)] = p.leader_id


class Session:
    """One client connection's connections upstream, one per broker (None: the bootstrap address)."""

    def __init__(self, cluster: Cluster, client_id: str | None) -> None:
        self.cluster, self.client_id = cluster, client_id
        self._links: dict[int | None, Link] = {}

    async def send(self, request: Any, node: int | None = None) -> Any:
        """The answer of the upstream broker `node` (None: the bootstrap address) to a kio request."""
        return await self._link(node).send(request, timeout_for(request))

    async def send_only(self, request: Any, node: int | None = None) -> None:
        await self._link(node).send_only(request)

    def _link(self, node: int | None) -> Link:
        address = self.cluster.bootstrap if node is None else self.cluster.brokers.get(node)
        if address is None:
            raise UpstreamError(f"upstream broker {node} is unknown")
        link = self._links.get(node)
        if link is None or (link.host, link.port) != address:
            if link is not None:
                link.close()
            link = self._links[node] = Link(*address, self.client_id)
        return link

    async def versions(self) -> dict[int, tuple[int, int]]:
        """The upstream's API versions, asked once per proxy."""
        if not self.cluster.versions:
            answer = await self.send(make(request_class(18, API_VERSIONS_VERSION)))
            if answer.error_code != 0:
                raise UpstreamError(f"upstream refused ApiVersions: error {answer.error_code}")
            self.cluster.versions = {a.api_key: (a.min_version, a.max_version) for a in answer.api_keys}
        return self.cluster.versions

    async def refresh(self, topics: Iterable[str], version: int = METADATA_VERSION) -> Any:
        """Ask the upstream for these topics' metadata (never auto-creating them); its answer."""
        await self.versions()
        cls = request_class(3, self.cluster.version(3, version))
        topic_cls = nested(cls, "MetadataRequestTopic")
        request = make(cls, topics=tuple(make(topic_cls, name=t, topic_id=None) for t in topics),
                       allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                       include_topic_authorized_operations=False)
        answer = await self.send(request)
        self.cluster.learn(answer)
        return answer

    async def leader(self, topic: str, partition: int) -> int | None:
        """The node leading an upstream partition, asking upstream if it is not known."""
        node = self.cluster.leaders.get((topic, partition))
        if node is None or node not in self.cluster.brokers:
            await self.refresh([topic])
            node = self.cluster.leaders.get((topic, partition))
        return node if node is not None and node >= 0 else None

    async def coordinator(self, group: str, key_type: int = 0) -> int:
        """The node coordinating a group (key_type 1: a transactional id), asking upstream if not known."""
        node = self.cluster.coordinators.get(group) if key_type == 0 else None
        if node is None:
            await self.versions()
            cls = request_class(10, self.cluster.version(10, FIND_COORDINATOR_VERSION))
            answer = await self.send(make(cls, key=group, key_type=key_type))
            if answer.error_code != 0:
                raise CoordinatorUnknown(int(answer.error_code))
            self.cluster.brokers[answer.node_id] = (answer.host, answer.port)
            node = answer.node_id
            if key_type == 0:
                self.cluster.coordinators[group] = node
        return node

    def forget_coordinator(self, group: str) -> None:
        self.cluster.coordinators.pop(group, None)

    async def close(self) -> None:
        for link in self._links.values():
            with contextlib.suppress(Exception):
                link.close()
        self._links.clear()


class CoordinatorUnknown(Exception):
    def __init__(self, error_code: int) -> None:
        super().__init__(f"upstream FindCoordinator failed: error {error_code}")
        self.error_code = error_code

