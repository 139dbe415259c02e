"""Produce v3-v11: hand each partition's batches to its owner; answer per acks.

v0-v2 are advertised but not served, as Kafka 4 does (KAFKA-18659): librdkafka up to 2.11 checks a
codec against the broker's Produce range with a fixed *minimum* version (0 for gzip, snappy and lz4),
so a broker advertising Produce from v3 gets every gzip/snappy/lz4 batch sent uncompressed by kcat
and older librdkafka clients. Clients negotiate the highest common version, so none sends v0-v2 but
one that knows nothing newer; those carry legacy message sets, which the broker cannot store, and
every partition in them is answered UNSUPPORTED_VERSION.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.apis.common import NO_THROTTLE, make, ms, response_module, to_datetime
from kafscale.acceptor.router import RequestContext, Router

if TYPE_CHECKING:
    from kafscale.actors.shard import ShardCore

API_KEY, MIN_VERSION, MAX_VERSION = 0, 0, 11
FIRST_SERVED_VERSION = 3  # v0-v2 carry legacy (magic 0/1) message sets


def register(router: Router, shard: ShardCore) -> None:
    async def handle(ctx: RequestContext, req: Any) -> Any | None:
        acks = int(req.acks)
        timeout_ms = ms(req.timeout, 30_000)
        jobs: list[tuple[str, int, Any]] = []
        errors: dict[tuple[str, int], dict[str, Any]] = {}
        for topic in req.topic_data:
            for part in topic.partition_data:
                key = (topic.name, int(part.index))
                if ctx.api_version < FIRST_SERVED_VERSION:
                    errors[key] = {"error": int(ErrorCode.unsupported_version)}
                elif acks not in (-1, 0, 1):
                    errors[key] = {"error": int(ErrorCode.invalid_required_acks)}
                elif getattr(req, "transactional_id", None) is not None:
                    errors[key] = {"error": int(ErrorCode.transactional_id_authorization_failed)}
                elif part.records is None:
                    errors[key] = {"error": int(ErrorCode.invalid_record), "message": "no records"}
                else:
                    jobs.append((topic.name, int(part.index), part.records))
        # One copy of each partition's records, which the owner then takes over and patches in place.
        results = await shard.produce_many([(t, p, bytearray(r)) for t, p, r in jobs], acks, timeout_ms)
        answers = dict(errors)
        for (t, p, _), result in zip(jobs, results, strict=True):
            answers[(t, p)] = result
        if acks == 0:
            return None
        mod = response_module(ctx)
        topics = []
        for topic in req.topic_data:
            partitions = []
            for part in topic.partition_data:
                r = answers[(topic.name, int(part.index))]
                partitions.append(make(
                    mod.PartitionProduceResponse,
                    index=part.index,
                    error_code=ErrorCode(r["error"]),
                    base_offset=r.get("base_offset", -1) if r["error"] == 0 else -1,
                    log_append_time=to_datetime(r.get("log_append_time", -1)),
                    log_start_offset=r.get("log_start_offset", -1),
                    record_errors=(),
                    error_message=r.get("message") if r["error"] else None,
                ))
            topics.append(make(mod.TopicProduceResponse, name=topic.name, partition_responses=tuple(partitions)))
        return make(mod.ProduceResponse, responses=tuple(topics), throttle_time=NO_THROTTLE)

    router.register(API_KEY, MIN_VERSION, MAX_VERSION, handle)
