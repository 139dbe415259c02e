"""Storing a flushed segment and its index: conditional creates, and when the plain keys are taken, the keys
of the owner's own epoch.

An object already at the plain key is either this owner's own earlier attempt (same bytes) or the leftover
of an owner that uploaded but never committed. Leftovers are never deleted here: a zombie deleting "its"
leftover could race with a successor that has just committed that key. Instead the owner writes the keys of
its epoch (`segment-{base}-e{epoch}.kfs`), which no other owner writes, and its commit records which keys it
used (`format.md`).
"""

from __future__ import annotations

import asyncio
import logging

from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.object_store import ObjectNotFoundError, ObjectStoreError

log = logging.getLogger(__name__)


async def upload_segment(objects: AsyncObjectStore, namespace: str, topic: str, partition: int, epoch: int,
                         base: int, segment: bytes, index: bytes) -> int:
    """Store segment and index; returns the key epoch they went to (0: the plain keys)."""
    plain = [(object_keys.segment_key(namespace, topic, partition, base), segment),
             (object_keys.index_key(namespace, topic, partition, base), index)]
    created = await objects.put_all_if_absent(plain)
    taken = [(key, data) for (key, data), new in zip(plain, created, strict=True) if not new]
    if not taken or all(await asyncio.gather(*(_holds(objects, key, data) for key, data in taken))):
        return 0
    log.info("%s-%d: an uncommitted leftover holds offset %d; writing the keys of epoch %d",
             topic, partition, base, epoch)
    for key, data in ((object_keys.segment_key(namespace, topic, partition, base, epoch), segment),
                      (object_keys.index_key(namespace, topic, partition, base, epoch), index)):
        if not await _place(objects, key, data):
            raise ObjectStoreError(f"{key} holds other bytes, yet only epoch {epoch} writes it")
    return epoch


async def _place(objects: AsyncObjectStore, key: str, data: bytes) -> bool:
    """Conditional create; True when the key now holds exactly `data`."""
    return await objects.put_if_absent(key, data) or await _holds(objects, key, data)


async def _holds(objects: AsyncObjectStore, key: str, data: bytes) -> bool:
    """After a conditional create found the key taken: True when it holds exactly `data`."""
    try:
        return await objects.get(key) == data
    except ObjectNotFoundError:  # removed between the two calls (a topic deletion): try once more
        return await objects.put_if_absent(key, data)
