"""Broker-side recompression for topics whose compression.type is not `producer`.

The only place the produce path decodes records: each batch is rewritten with the topic's codec,
keeping what Kafka keeps (producer id, epoch, base sequence, timestamps, keys, values, headers), so
idempotent producers and consumers see no difference but the codec. Batches already in the wanted
codec pass through untouched.
"""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kafscale.storage.batch import BatchHeader, split_batches

CODECS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def recompress_batches(buf: bytearray, batches: list[tuple[int, BatchHeader]],
                       codec_name: str) -> tuple[bytearray, list[tuple[int, BatchHeader]]]:
    """buf re-encoded with codec_name, and its batch list; (buf, batches) as given when nothing changes."""
    codec = CODECS[codec_name]
    if all(h.compression == codec for _, h in batches):
        return buf, batches
    out = bytearray()
    for pos, header in batches:
        raw = bytes(buf[pos : pos + header.size])
        if header.compression == codec:
            out += raw
            continue
        batch = DefaultRecordBatch(raw)
        builder = DefaultRecordBatchBuilder(2, codec, int(header.is_transactional), header.producer_id,
                                            header.producer_epoch, header.base_sequence, 2**31 - 1)
        for i, record in enumerate(batch):
            builder.append(i, timestamp=record.timestamp, key=record.key, value=record.value,
                           headers=list(record.headers))
        out += builder.build()
    return out, split_batches(out, verify_crc=False)
