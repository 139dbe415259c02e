"""`kafscale group list|describe|reset-offsets|delete`: consumer groups over the Kafka admin protocol."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from kafscale.commands.client import HINTS, CommandError, add_common, admin, emit, run_command, table, wait


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("group", help="list, describe, reset and delete consumer groups")
    sub = parser.add_subparsers(dest="group_command", required=True)
    p = sub.add_parser("list", help="groups and their states")
    p.set_defaults(run=run_command(list_groups))
    p = sub.add_parser("describe", help="members, committed offsets and lag of a group")
    p.add_argument("group")
    p.set_defaults(run=run_command(describe))
    p = sub.add_parser("reset-offsets", help="move a group's committed offsets (the group must be empty)")
    p.add_argument("group")
    p.add_argument("-t", "--topic", required=True)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_true")
    where.add_argument("--to-latest", action="store_true")
    where.add_argument("--to-offset", type=int)
    where.add_argument("--shift-by", type=int, help="relative to the committed offset")
    p.add_argument("--execute", action="store_true", help="apply (default: only show the plan)")
    p.set_defaults(run=run_command(reset_offsets))
    p = sub.add_parser("delete", help="delete groups (with their committed offsets)")
    p.add_argument("groups", nargs="+")
    p.set_defaults(run=run_command(delete))
    for p in sub.choices.values():
        add_common(p)


def list_groups(args: argparse.Namespace) -> int:
    client = admin(args)  # referenced until the result is in: a dropped AdminClient cancels its requests
    result = wait(client.list_consumer_groups(request_timeout=args.timeout), args, "list groups")
    for error in result.errors:
        print(f"kafscale: a broker did not list its groups: {error}", file=sys.stderr)
    groups = sorted(({"group": g.group_id, "state": g.state.name if g.state else "UNKNOWN",
                      "type": g.type.name if getattr(g, "type", None) is not None else "UNKNOWN"}
                     for g in result.valid), key=lambda g: g["group"])
    emit(args, groups, lambda d: table([[g["group"], g["state"], g["type"].lower()] for g in d],
                                       ["GROUP", "STATE", "TYPE"]) if d else "no groups")
    return 0


def _committed(client: Any, args: argparse.Namespace, group: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    fut = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=args.timeout)
    answer = wait(fut[group], args, f"offsets of {group!r}")
    return {(tp.topic, tp.partition): tp.offset for tp in answer.topic_partitions if tp.offset >= 0}


def _offsets(client: Any, args: argparse.Namespace, parts: list[tuple[str, int]], spec: Any) -> dict[Any, int]:
    from confluent_kafka import TopicPartition

    if not parts:
        return {}
    futures = client.list_offsets({TopicPartition(t, p): spec for t, p in parts}, request_timeout=args.timeout)
    return {(tp.topic, tp.partition): wait(f, args, "list offsets").offset for tp, f in futures.items()}


def describe(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import OffsetSpec

    client = admin(args)
    desc = wait(client.describe_consumer_groups([args.group], request_timeout=args.timeout)[args.group], args,
                f"describe {args.group!r}", {"GROUP_ID_NOT_FOUND": "List groups with `kafscale group list`."})
    committed = _committed(client, args, args.group)
    latest = _offsets(client, args, sorted(committed), OffsetSpec.latest())
    consumer_protocol = getattr(desc, "type", None) is not None and desc.type.name == "CONSUMER"
    epochs = _member_epochs(args, args.group) if consumer_protocol and desc.members else {}
    owner = {(tp.topic, tp.partition): m.member_id for m in desc.members
             for tp in (m.assignment.topic_partitions if m.assignment else [])}
    data = {
        "group": args.group, "state": desc.state.name if desc.state else "UNKNOWN",
        "type": desc.type.name if getattr(desc, "type", None) is not None else "UNKNOWN",
        "assignor": desc.partition_assignor or "",
        "members": [{"member_id": m.member_id, "client_id": m.client_id, "host": m.host,
                     "assignment": _partitions(m.assignment),
                     # KIP-848 groups: where the broker's assignor is taking the member (classic groups: none)
                     "target_assignment": _partitions(m.target_assignment)
                     if getattr(m, "target_assignment", None) is not None else None,
                     "epoch": epochs.get(m.member_id)} for m in desc.members],
        "offsets": [{"topic": t, "partition": p, "committed": c, "latest": latest.get((t, p), -1),
                     "lag": max(latest.get((t, p), c) - c, 0), "member": owner.get((t, p))}
                    for (t, p), c in sorted(committed.items())],
    }

    def text(d: dict[str, Any]) -> str:
        rows = [[o["topic"], o["partition"], o["committed"], o["latest"], o["lag"], o["member"] or "-"]
                for o in d["offsets"]]
        members = [[m["member_id"], m["client_id"], m["host"], "-" if m["epoch"] is None else m["epoch"],
                    _spans(m["assignment"]), "-" if m["target_assignment"] is None else _spans(m["target_assignment"])]
                   for m in d["members"]]
        head = (f"group {d['group']}: {d['state']}, {d['type'].lower()} protocol"
                f"{', assignor ' + d['assignor'] if d['assignor'] else ''}, {len(d['members'])} member(s)\n\n")
        if members:
            head += table(members, ["MEMBER", "CLIENT", "HOST", "EPOCH", "ASSIGNED", "TARGET"]) + "\n\n"
        return head + table(rows, ["TOPIC", "PARTITION", "COMMITTED", "LATEST", "LAG", "MEMBER"])
    emit(args, data, text)
    return 0


def _member_epochs(args: argparse.Namespace, group: str) -> dict[str, int]:
    """Each member's epoch in a consumer-protocol group, from ConsumerGroupDescribe at the group's coordinator:
    librdkafka's admin API does not give them. Asked over a plain connection, so not when -X configures the client
    (TLS or SASL); then, or if the cluster cannot answer, the epochs are left out."""
    if args.client_config:
        return {}
    host, _, port = args.bootstrap_server.split(",")[0].rpartition(":")
    try:
        return asyncio.run(asyncio.wait_for(_ask_epochs(host, int(port), group), args.timeout))
    except Exception:  # an extra column, never a reason to fail the command
        return {}


async def _ask_epochs(host: str, port: int, group: str) -> dict[str, int]:
    from kafscale.protocol.codec import make, request_class
    from kafscale.proxy.upstream import Link

    bootstrap = Link(host, port, "kafscale-cli")
    try:
        found = await bootstrap.send(make(request_class(10, 4), key_type=0, coordinator_keys=(group,)), 10)
    finally:
        bootstrap.close()
    [coordinator] = found.coordinators
    link = Link(coordinator.host, coordinator.port, "kafscale-cli")
    try:
        answer = await link.send(make(request_class(69, 0), group_ids=(group,), include_authorized_operations=False),
                                 10)
    finally:
        link.close()
    return {m.member_id: int(m.member_epoch) for g in answer.groups if g.error_code == 0 for m in g.members}


def _partitions(assignment: Any) -> list[list[Any]]:
    """[[topic, partition], ...] of a member's assignment, sorted."""
    return sorted([tp.topic, tp.partition] for tp in (assignment.topic_partitions if assignment else []))


def _spans(partitions: list[list[Any]]) -> str:
    """topic:0,1,2 per topic, or "-"."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in by_topic.items()) or "-"


def reset_offsets(args: argparse.Namespace) -> int:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    client = admin(args)
    md = client.list_topics(timeout=args.timeout).topics.get(args.topic)
    if md is None or md.error is not None:
        raise CommandError(f"topic {args.topic!r} does not exist\n  List topics with `kafscale topic list`.")
    parts = [(args.topic, p) for p in sorted(md.partitions)]
    earliest = _offsets(client, args, parts, OffsetSpec.earliest())
    latest = _offsets(client, args, parts, OffsetSpec.latest())
    committed = _committed(client, args, args.group) if args.shift_by is not None else {}
    plan = {}
    for tp in parts:
        if args.to_earliest:
            target = earliest[tp]
        elif args.to_latest:
            target = latest[tp]
        elif args.to_offset is not None:
            target = args.to_offset
        else:
            target = committed.get(tp, earliest[tp]) + args.shift_by
        plan[tp] = min(max(target, earliest[tp]), latest[tp])  # Kafka's tool clamps into the log, too
    if args.execute:
        request = ConsumerGroupTopicPartitions(args.group, [TopicPartition(t, p, o) for (t, p), o in plan.items()])
        fut = client.alter_consumer_group_offsets([request], request_timeout=args.timeout)
        answer = wait(fut[args.group], args, f"reset offsets of {args.group!r}")
        # Each partition answers for itself: the future succeeds even when the group refused every offset.
        refused = next((tp.error for tp in answer.topic_partitions if tp.error is not None), None)
        if refused is not None:
            live = refused.name() in ("UNKNOWN_MEMBER_ID", "REBALANCE_IN_PROGRESS")
            hint = f"\n  {HINTS['NON_EMPTY_GROUP']}" if live else ""
            raise CommandError(f"reset offsets of {args.group!r}: {refused.str()}{hint}")
    data = {"group": args.group, "executed": args.execute,
            "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in plan.items()]}

    def text(d: dict[str, Any]) -> str:
        head = "reset" if d["executed"] else "would reset (add --execute to apply)"
        return f"{head} group {d['group']}:\n" + table(
            [[o["topic"], o["partition"], o["offset"]] for o in d["offsets"]], ["TOPIC", "PARTITION", "NEW OFFSET"])
    emit(args, data, text)
    return 0


def delete(args: argparse.Namespace) -> int:
    client = admin(args)
    futures = client.delete_consumer_groups(args.groups, request_timeout=args.timeout)
    for group in args.groups:
        wait(futures[group], args, f"delete group {group!r}")
    emit(args, {"deleted": args.groups}, lambda d: "\n".join(f"deleted group {g}" for g in d["deleted"]))
    return 0
