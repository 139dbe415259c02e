"""Produce v12 (KIP-890 part 2): v11 on the wire (ProduceRequest.json: "Version 12 is the same as version 11").
What differs is its meaning: a transactional producer sending v12 adds each partition to its transaction through
the partition's leader, and sends no AddPartitionsToTxn (kafscale.broker.txn_produce). The broker reads and writes
Produce with its own codec (kafscale.protocol.produce_codec); these classes serve everything else (the router's
version table, the tests' kio encoder)."""

from dataclasses import dataclass
from typing import ClassVar

from kio.schema.produce.v11 import request as v11_request
from kio.schema.produce.v11 import response as v11_response
from kio.schema.produce.v11.request import PartitionProduceData, TopicProduceData
from kio.schema.produce.v11.response import (
    BatchIndexAndErrorMessage,
    LeaderIdAndEpoch,
    NodeEndpoint,
    PartitionProduceResponse,
    TopicProduceResponse,
)
from kio.static.primitive import i16

__all__ = ["BatchIndexAndErrorMessage", "LeaderIdAndEpoch", "NodeEndpoint", "PartitionProduceData",
           "PartitionProduceResponse", "ProduceRequest", "ProduceResponse", "TopicProduceData",
           "TopicProduceResponse"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequest(v11_request.ProduceRequest):
    __version__: ClassVar[i16] = i16(12)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponse(v11_response.ProduceResponse):
    __version__: ClassVar[i16] = i16(12)


REQUEST = ProduceRequest
RESPONSE = ProduceResponse
