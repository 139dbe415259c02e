"""TxnOffsetCommit v5 (KIP-890 part 2): v4 on the wire. What differs is its meaning: the group joins the producer's
transaction through this request (its coordinator adds it), and the client sends no AddOffsetsToTxn."""

from dataclasses import dataclass
from typing import ClassVar

from kio.schema.txn_offset_commit.v4 import request as v4_request
from kio.schema.txn_offset_commit.v4 import response as v4_response
from kio.schema.txn_offset_commit.v4.request import TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic
from kio.schema.txn_offset_commit.v4.response import TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic
from kio.static.primitive import i16

__all__ = ["TxnOffsetCommitRequest", "TxnOffsetCommitRequestPartition", "TxnOffsetCommitRequestTopic",
           "TxnOffsetCommitResponse", "TxnOffsetCommitResponsePartition", "TxnOffsetCommitResponseTopic"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnOffsetCommitRequest(v4_request.TxnOffsetCommitRequest):
    __version__: ClassVar[i16] = i16(5)


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnOffsetCommitResponse(v4_response.TxnOffsetCommitResponse):
    __version__: ClassVar[i16] = i16(5)


REQUEST = TxnOffsetCommitRequest
RESPONSE = TxnOffsetCommitResponse
