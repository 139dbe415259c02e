"""`kafscale topic create|list|describe|alter|delete`: topics over the Kafka admin protocol."""

from __future__ import annotations

import argparse
from typing import Any

from kafscale.commands.client import (
    CommandError,
    Progress,
    add_common,
    add_progress,
    admin,
    emit,
    parse_pairs,
    run_command,
    table,
    wait,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("topic", help="create, list, describe, alter and delete topics")
    sub = parser.add_subparsers(dest="topic_command", required=True)

    p = sub.add_parser("create", help="create a topic")
    p.add_argument("name")
    p.add_argument("-p", "--partitions", type=int, default=-1, help="number of partitions (default: broker's)")
    p.add_argument("-c", "--config", action="append", default=[], metavar="KEY=VALUE",
                   help="topic config, e.g. -c retention.ms=86400000 (repeatable)")
    p.set_defaults(run=run_command(create))

    p = sub.add_parser("list", help="list topics")
    p.set_defaults(run=run_command(list_topics))

    p = sub.add_parser("describe", help="partitions, offsets and configs of a topic")
    p.add_argument("name")
    p.set_defaults(run=run_command(describe))

    p = sub.add_parser("alter", help="add partitions, set or remove configs")
    p.add_argument("name")
    p.add_argument("-p", "--partitions", type=int, help="new (larger) partition count")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set a config (repeatable)")
    p.add_argument("--delete", action="append", default=[], metavar="KEY", help="back to the default (repeatable)")
    p.set_defaults(run=run_command(alter))

    p = sub.add_parser("delete", help="delete topics and their data")
    p.add_argument("names", nargs="+")
    add_progress(p)
    p.set_defaults(run=run_command(delete))
    for p in sub.choices.values():
        add_common(p)


def create(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import NewTopic

    client = admin(args)
    configs = parse_pairs(args.config, "--config")
    topic = NewTopic(args.name, num_partitions=args.partitions, replication_factor=-1, config=configs)
    wait(client.create_topics([topic], request_timeout=args.timeout)[args.name], args, f"create {args.name!r}")
    partitions = len(client.list_topics(args.name, timeout=args.timeout).topics[args.name].partitions)
    emit(args, {"topic": args.name, "partitions": partitions, "configs": configs},
         lambda d: f"created topic {d['topic']} with {d['partitions']} partition(s)")
    return 0


def list_topics(args: argparse.Namespace) -> int:
    md = admin(args).list_topics(timeout=args.timeout)
    topics = sorted((name, len(t.partitions)) for name, t in md.topics.items() if not name.startswith("__"))
    emit(args, [{"topic": n, "partitions": p} for n, p in topics],
         lambda d: table([[t["topic"], t["partitions"]] for t in d], ["TOPIC", "PARTITIONS"]) if d else "no topics")
    return 0


def describe(args: argparse.Namespace) -> int:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import ConfigResource, OffsetSpec

    client = admin(args)
    md = client.list_topics(timeout=args.timeout).topics.get(args.name)  # naming it could auto-create it
    if md is None or md.error is not None:
        raise CommandError(f"topic {args.name!r} does not exist\n  List topics with `kafscale topic list`.")
    parts = sorted(md.partitions)
    offsets: dict[str, dict[int, int]] = {}
    for spec_name, spec in (("earliest", OffsetSpec.earliest()), ("latest", OffsetSpec.latest())):
        futures = client.list_offsets({TopicPartition(args.name, p): spec for p in parts},
                                      request_timeout=args.timeout)
        offsets[spec_name] = {tp.partition: wait(f, args, f"offsets of {args.name}").offset
                              for tp, f in futures.items()}
    res = ConfigResource(ConfigResource.Type.TOPIC, args.name)
    entries = wait(client.describe_configs([res], request_timeout=args.timeout)[res], args, "configs")
    data = {
        "topic": args.name,
        "partitions": [{"partition": p, "leader": md.partitions[p].leader, "earliest": offsets["earliest"][p],
                        "latest": offsets["latest"][p]} for p in parts],
        "configs": {name: {"value": e.value, "default": e.is_default} for name, e in sorted(entries.items())},
    }

    def text(d: dict[str, Any]) -> str:
        rows = [[p["partition"], p["leader"], p["earliest"], p["latest"], p["latest"] - p["earliest"]]
                for p in d["partitions"]]
        configs = [[k, v["value"], "" if v["default"] else "(set)"] for k, v in d["configs"].items()]
        return (f"topic {d['topic']}: {len(rows)} partition(s)\n\n"
                + table(rows, ["PARTITION", "LEADER", "EARLIEST", "LATEST", "RECORDS"]) + "\n\n"
                + table(configs, ["CONFIG", "VALUE", ""]))
    emit(args, data, text)
    return 0


def alter(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions

    if args.partitions is None and not args.set and not args.delete:
        raise CommandError("nothing to change: give --partitions N, --set KEY=VALUE or --delete KEY")
    client = admin(args)
    changed: dict[str, Any] = {"topic": args.name}
    if args.partitions is not None:
        fut = client.create_partitions([NewPartitions(args.name, args.partitions)], request_timeout=args.timeout)
        wait(fut[args.name], args, f"add partitions to {args.name!r}")
        changed["partitions"] = args.partitions
    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
           for k, v in parse_pairs(args.set, "--set").items()]
    ops += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in args.delete]
    if ops:
        res = ConfigResource(ConfigResource.Type.TOPIC, args.name, incremental_configs=ops)
        wait(client.incremental_alter_configs([res], request_timeout=args.timeout)[res], args,
             f"alter configs of {args.name!r}")
        changed["set"] = parse_pairs(args.set, "--set")
        changed["deleted"] = args.delete
    emit(args, changed, lambda d: f"altered topic {d['topic']}")
    return 0


def delete(args: argparse.Namespace) -> int:
    client = admin(args)
    futures = client.delete_topics(args.names, request_timeout=args.timeout)
    progress = Progress("deleting", len(args.names), enabled=args.progress)
    deleted, errors = [], []
    for name in args.names:
        try:
            wait(futures[name], args, f"delete {name!r}")
            deleted.append(name)
        except CommandError as e:
            errors.append(str(e))
        progress.advance()
    progress.close()
    emit(args, {"deleted": deleted}, lambda d: "\n".join(f"deleted topic {n}" for n in d["deleted"]))
    if errors:
        raise CommandError("\n".join(errors))
    return 0
