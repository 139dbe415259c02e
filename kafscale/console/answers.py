"""Kafka's answers to the console's clients, as the console's own: a ConsoleError with the HTTP status it gets."""

from __future__ import annotations

import asyncio
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from kafscale.console.view import ConsoleError

TIMEOUT_S = 15.0
# Kafka's answers, as the HTTP status the console gives them.
STATUS = {
    KafkaError.UNKNOWN_TOPIC_OR_PART: 404, KafkaError.GROUP_ID_NOT_FOUND: 404,
    KafkaError.TOPIC_ALREADY_EXISTS: 409, KafkaError.NON_EMPTY_GROUP: 409,
    KafkaError.UNKNOWN_MEMBER_ID: 409, KafkaError.REBALANCE_IN_PROGRESS: 409,
    KafkaError.TOPIC_AUTHORIZATION_FAILED: 403, KafkaError.GROUP_AUTHORIZATION_FAILED: 403,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: 403,
    KafkaError.TOPIC_EXCEPTION: 400, KafkaError.INVALID_PARTITIONS: 400,
    KafkaError.INVALID_CONFIG: 400, KafkaError.INVALID_REPLICATION_FACTOR: 400,
    KafkaError.POLICY_VIOLATION: 400, KafkaError.INVALID_REQUEST: 400, KafkaError.MSG_SIZE_TOO_LARGE: 400,
    KafkaError.RECORD_LIST_TOO_LARGE: 400, KafkaError.INVALID_RECORD: 400,
    KafkaError.RESOURCE_NOT_FOUND: 404, KafkaError._UNKNOWN_PARTITION: 404, KafkaError._UNKNOWN_TOPIC: 404,
    KafkaError.LEADER_NOT_AVAILABLE: 503, KafkaError.NOT_LEADER_FOR_PARTITION: 503,
    KafkaError._TIMED_OUT: 504, KafkaError.REQUEST_TIMED_OUT: 504, KafkaError._MSG_TIMED_OUT: 504,
}


def failed(what: str, e: BaseException) -> ConsoleError:
    error = e.args[0] if isinstance(e, KafkaException) and e.args else None
    if isinstance(error, KafkaError):
        return ConsoleError(STATUS.get(error.code(), 502), f"{what}: {error.name()}: {error.str()}")
    return ConsoleError(502, f"{what}: {e}")


async def answer_of(what: str, fut: Any) -> Any:
    try:
        return await asyncio.wait_for(asyncio.wrap_future(fut), TIMEOUT_S)
    except TimeoutError:
        raise ConsoleError(504, f"{what}: no answer from the cluster within {TIMEOUT_S:.0f}s") from None
    except KafkaException as e:
        raise failed(what, e) from None
