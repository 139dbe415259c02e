"""`kafscale produce TOPIC`: one record per line of stdin (or --file), with keys, headers and a partition."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kafscale.commands.client import (
    CommandError,
    Progress,
    add_common,
    add_progress,
    client_config,
    emit,
    parse_pairs,
    reachable,
    run_command,
)


def add_parser(commands: Any) -> None:
    p = commands.add_parser("produce", help="write records from stdin, one per line")
    p.add_argument("topic")
    p.add_argument("-k", "--key", help="the same key for every record")
    p.add_argument("-K", "--key-separator", help="split each line at the first SEP into key and value")
    p.add_argument("-H", "--header", action="append", default=[], metavar="KEY=VALUE", help="header (repeatable)")
    p.add_argument("-p", "--partition", type=int, help="partition (default: by key, else spread)")
    p.add_argument("-f", "--file", help="read lines from FILE instead of stdin")
    p.add_argument("--acks", choices=("0", "1", "all"), default="all")
    p.add_argument("--compression", default="none", help="none, gzip, snappy, lz4, zstd")
    add_progress(p)
    add_common(p)
    p.set_defaults(run=run_command(run))


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException, Producer

    headers = list(parse_pairs(args.header, "--header").items())
    producer = Producer(client_config(args, **{"acks": args.acks, "compression.type": args.compression,
                                               "linger.ms": 5}))
    reachable(producer, args)  # an unknown topic is auto-created by the broker, or fails per record
    failures: list[str] = []
    per_partition: dict[int, int] = {}
    progress = Progress(f"producing to {args.topic}", enabled=args.progress)

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(err.str())
        else:
            per_partition[msg.partition()] = per_partition.get(msg.partition(), 0) + 1
            progress.advance()

    source = open(args.file, "rb") if args.file else sys.stdin.buffer  # noqa: SIM115 - closed below
    sep = args.key_separator.encode() if args.key_separator else None
    try:
        for raw in source:
            line = raw.rstrip(b"\r\n")
            key = args.key.encode() if args.key is not None else None
            if sep is not None:
                if sep not in line:
                    raise CommandError(f"line without the key separator {args.key_separator!r}: {line[:60]!r}")
                key, line = line.split(sep, 1)
            kwargs: dict[str, Any] = {"key": key, "value": line, "headers": headers, "on_delivery": delivered}
            if args.partition is not None:
                kwargs["partition"] = args.partition
            while True:
                try:
                    producer.produce(args.topic, **kwargs)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)
                except KafkaException as e:
                    raise CommandError(f"cannot produce to {args.topic}: {e.args[0].str()}\n"
                                       "  `kafscale topic describe TOPIC` shows its partitions.") from None
            producer.poll(0)
        remaining = producer.flush(args.timeout)
    finally:
        if args.file:
            source.close()
        progress.close()
    if remaining:
        failures.append(f"{remaining} record(s) still undelivered after {args.timeout}s")
    total = sum(per_partition.values())
    emit(args, {"topic": args.topic, "produced": total, "partitions": per_partition},
         lambda d: f"produced {d['produced']} record(s) to {d['topic']}", out=sys.stderr if args.output == "text"
         else sys.stdout)
    if failures:
        raise CommandError(f"{len(failures)} record(s) failed: {failures[0]}\n"
                           "  Check the topic exists (`kafscale topic list`) and the partition is in range.")
    return 0
