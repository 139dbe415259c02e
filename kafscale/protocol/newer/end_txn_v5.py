"""EndTxn v5 (KIP-890 part 2): the request is v4's; the response adds the producer id and epoch the client goes on
with, since the coordinator bumps the epoch at the end of every transaction (EndTxnResponse.json, "5+", default
-1, not tagged)."""

from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.end_txn.v4 import request as v4_request
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v1.header import ResponseHeader
from kio.schema.types import ProducerId
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32Timedelta

__all__ = ["EndTxnRequest", "EndTxnResponse"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EndTxnRequest(v4_request.EndTxnRequest):
    __version__: ClassVar[i16] = i16(5)


@dataclass(frozen=True, slots=True, kw_only=True)
class EndTxnResponse:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(5)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(26)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    producer_id: ProducerId = field(metadata={"kafka_type": "int64"}, default=ProducerId(-1))
    """The producer id the client uses from now on (-1 with an error)."""
    producer_epoch: i16 = field(metadata={"kafka_type": "int16"}, default=i16(-1))
    """The producer epoch the client uses from now on (-1 with an error)."""


REQUEST = EndTxnRequest
RESPONSE = EndTxnResponse
