"""`kafscale consume TOPIC`: records to stdout, one per line (or JSON lines), from the end or the beginning,
optionally as a consumer group, until --count records or --idle-timeout seconds without one."""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
import uuid
from typing import Any

from kafscale.commands.client import (
    CommandError,
    Progress,
    add_common,
    add_progress,
    client_config,
    reachable,
    run_command,
)


def add_parser(commands: Any) -> None:
    p = commands.add_parser("consume", help="read records to stdout")
    p.add_argument("topic")
    p.add_argument("-g", "--group", help="consume as this group (committing offsets); default: no group")
    p.add_argument("--from-beginning", action="store_true", help="start at the earliest offset (default: end)")
    p.add_argument("--offset", type=int, help="start at this offset (with --partition)")
    p.add_argument("-p", "--partition", type=int, help="only this partition")
    p.add_argument("-n", "--count", type=int, help="stop after this many records")
    p.add_argument("--idle-timeout", type=float, help="stop after this many seconds without a record")
    p.add_argument("--print-key", action="store_true", help="text output: KEY<separator>VALUE")
    p.add_argument("--print-headers", action="store_true", help="text output: headers before the value")
    p.add_argument("--separator", default="\t", help="between key, headers and value in text output")
    add_progress(p)
    add_common(p)
    p.set_defaults(run=run_command(run))


def _text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", errors="backslashreplace")


def _json_bytes(b: bytes | None) -> str | None:
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(b).decode()


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    grouped = args.group is not None
    conf = client_config(args, **{
        "group.id": args.group or f"kafscale-cli-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": grouped, "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "enable.partition.eof": False})
    consumer = Consumer(conf)
    md = reachable(consumer, args).topics.get(args.topic)
    if md is None or md.error is not None:
        consumer.close()
        raise CommandError(f"topic {args.topic!r} does not exist\n  List topics with `kafscale topic list`.")
    if args.offset is not None and args.partition is None:
        consumer.close()
        raise CommandError("--offset needs --partition")
    if grouped and args.partition is None:
        consumer.subscribe([args.topic])
    else:
        start = args.offset if args.offset is not None else OFFSET_BEGINNING if args.from_beginning else OFFSET_END
        parts = [args.partition] if args.partition is not None else sorted(md.partitions)
        consumer.assign([TopicPartition(args.topic, p, start) for p in parts])
    progress = Progress(f"consuming {args.topic}", args.count, enabled=args.progress)
    seen, last = 0, time.monotonic()
    try:
        while args.count is None or seen < args.count:
            msg = consumer.poll(0.2)
            if msg is None:
                if args.idle_timeout is not None and time.monotonic() - last > args.idle_timeout:
                    break
                continue
            if msg.error() is not None:
                if msg.error().fatal():
                    raise CommandError(f"consumer failed: {msg.error().str()}")
                print(f"kafscale: {msg.error().str()}", file=sys.stderr)
                continue
            last = time.monotonic()
            seen += 1
            _print(args, msg)
            progress.advance()
    finally:
        progress.close()
        consumer.close()  # commits the group's position (auto commit) and leaves the group
    return 0


def _print(args: argparse.Namespace, msg: Any) -> None:
    headers = msg.headers() or []
    if args.output == "json":
        _, ts = msg.timestamp()
        line = json.dumps({"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(),
                           "timestamp": ts, "key": _json_bytes(msg.key()), "value": _json_bytes(msg.value()),
                           "headers": [[k, _json_bytes(v)] for k, v in headers]})
    else:
        fields = []
        if args.print_key:
            fields.append(_text(msg.key()) or "")
        if args.print_headers:
            fields.append(",".join(f"{k}={_text(v) or ''}" for k, v in headers))
        fields.append(_text(msg.value()) or "")
        line = args.separator.join(fields)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
