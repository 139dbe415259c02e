"""The metadata store's key schema (relative to the store's prefix, e.g. /kafscale/ in etcd).

cluster                                     {cluster_id, created_ms}
deleted_topics/{name}                       {at_ms}   a deleted topic whose objects may still be in the object store
                                             (broker/janitor.py removes them, then this key)
topics/{name}                               {id, partitions, configs, created_ms, placement: [shard, ...],
                                             leader_epochs: [epoch, ...]}   partition p is led by placement[p]
cluster/brokers/{id}                        {id, host, port, node_id, node_ip, pid, started_ms, listeners:
                                             [[name, host, port], ...]}   under the
                                             shard's lease: present while the shard is alive and serving
cluster/shards/{id}                         {id, node_id, node_ip, slot, host, port}   the shards the controller
                                             wants (slot: which port of its address)
cluster/next_shard_id                       next free shard id (shard ids are broker ids: never reused)
cluster/groups                              {slots: [shard, ...], epochs: [epoch, ...]}   group coordination
cluster/draining                            {shards: [id, ...]}   drained shards: no new work goes there
partitions/{topic}/{p}/owner                {epoch, shard}                      fencing token
partitions/{topic}/{p}/state                {next_offset, log_start_offset, epoch}
partitions/{topic}/{p}/segments/{base:020d} {base, last, size, records, min_ts, max_ts, crc, created_ms,
                                             key_epoch[, aborted: [[pid, first, marker], ...]][, cleaned]}
                                             (key_epoch, cleaned: which object key, see storage/keys.py;
                                             aborted: the transactions its markers abort)
partitions/{topic}/{p}/cleaner              {first_dirty, cleaning, cleaned_ms}   a compacted partition's
                                             cleaner checkpoint: where the last pass stopped (compaction)
partitions/{topic}/{p}/producers/{pid}      {epoch, batches: [[first_seq, last_seq, base, last], ...][,
                                             txn_first]}  (txn_first: where its open transaction starts)
producer_ids/next                           next free producer id
groups/{g}                                  {generation, protocol_type, protocol, leader, state_ms, members: [...]}
                                            written when the generation changes (and with a group's first commit);
                                            a consumer-protocol group's: {type: consumer, epoch, assignment_epoch,
                                            assignor, subscribed, state_ms}, its members under group_members/
group_members/{g}/{member}                  {id, epoch, state, assigned, revoking, assigned_at, target, ...}   one
                                            member of a consumer-protocol group, written when it changes
                                            (groups/consumer/stored.py)
group_offsets/{g}/{topic}/{p}               {offset, leader_epoch, metadata, commit_ms[, expire_ms]}
group_txn_offsets/{g}/{producer_id}         {producer_epoch, transactional_id, started_ms, offsets: [[topic, p,
                                             {offset, leader_epoch, metadata, commit_ms}], ...]}   TxnOffsetCommit
                                            offsets of one producer's open transaction: committed offsets only
                                            when the transaction commits (groups/txn_offsets.py)
group_coordinators/{g}                      {epoch, shard}                      fencing token of the coordinator
transactions/{tid}                          {producer_id, producer_epoch, last_producer_id, last_producer_epoch,
                                             state, partitions: [[topic, p], ...], groups: [g, ...], timeout_ms,
                                             start_ms, update_ms, coordinator_epoch}   a transactional id's
                                             transaction (kafscale/transactions/state.py); every write compares
                                             its mod_revision (fencing of coordinator incarnations)
security/scram/{user}/{mechanism}         {mechanism, iterations, salt, stored_key, server_key}   SCRAM
                                            credentials (never a password); {user} percent-encoded
({g} is the group id percent-encoded: group ids may contain '/'; {member}, {tid}, the member and transactional
ids, likewise.)
"""

from __future__ import annotations

from urllib.parse import quote

CLUSTER = "cluster"
PRODUCER_ID_NEXT = "producer_ids/next"
TOPICS = "topics/"
DELETED_TOPICS = "deleted_topics/"
GROUPS = "groups/"
CLUSTER_PREFIX = "cluster/"
BROKERS = "cluster/brokers/"
SHARDS = "cluster/shards/"
NEXT_SHARD_ID = "cluster/next_shard_id"
GROUP_SLOTS = "cluster/groups"
DRAINING = "cluster/draining"
AUTOSCALE = "cluster/autoscale"
TRANSACTIONS = "transactions/"
SCRAM_CREDENTIALS = "security/scram/"  # --autoscale: the shard count wanted, and the shards being drained to stop


def broker(shard_id: int) -> str:
    return f"{BROKERS}{shard_id}"


def shard(shard_id: int) -> str:
    return f"{SHARDS}{shard_id}"


def topic(name: str) -> str:
    return f"topics/{name}"


def deleted_topic(name: str) -> str:
    return f"{DELETED_TOPICS}{name}"


def partition_prefix(topic_name: str, partition: int | None = None) -> str:
    if partition is None:
        return f"partitions/{topic_name}/"
    return f"partitions/{topic_name}/{partition}/"


def owner(topic_name: str, partition: int) -> str:
    return partition_prefix(topic_name, partition) + "owner"


def state(topic_name: str, partition: int) -> str:
    return partition_prefix(topic_name, partition) + "state"


def segments(topic_name: str, partition: int) -> str:
    return partition_prefix(topic_name, partition) + "segments/"


def segment(topic_name: str, partition: int, base_offset: int) -> str:
    return f"{segments(topic_name, partition)}{base_offset:020d}"


def cleaner(topic_name: str, partition: int) -> str:
    return partition_prefix(topic_name, partition) + "cleaner"


def producers(topic_name: str, partition: int) -> str:
    return partition_prefix(topic_name, partition) + "producers/"


def producer(topic_name: str, partition: int, producer_id: int) -> str:
    return f"{producers(topic_name, partition)}{producer_id}"


def _group(group_id: str) -> str:
    return quote(group_id, safe="")


def group(group_id: str) -> str:
    return GROUPS + _group(group_id)


def group_offsets(group_id: str) -> str:
    return f"group_offsets/{_group(group_id)}/"


def group_offset(group_id: str, topic_name: str, partition: int) -> str:
    return f"{group_offsets(group_id)}{topic_name}/{partition}"


def group_members(group_id: str) -> str:
    return f"group_members/{_group(group_id)}/"


def group_member(group_id: str, member_id: str) -> str:
    return group_members(group_id) + quote(member_id, safe="")


def group_txn_offsets(group_id: str) -> str:
    return f"group_txn_offsets/{_group(group_id)}/"


def group_txn_offset(group_id: str, producer_id: int) -> str:
    return f"{group_txn_offsets(group_id)}{producer_id}"


def group_coordinator(group_id: str) -> str:
    return f"group_coordinators/{_group(group_id)}"


def transaction(transactional_id: str) -> str:
    return TRANSACTIONS + quote(transactional_id, safe="")


def scram_credential(user: str, mechanism: str) -> str:
    return f"{SCRAM_CREDENTIALS}{quote(user, safe='')}/{mechanism}"
