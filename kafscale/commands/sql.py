"""`kafscale sql "SELECT … FROM orders WHERE …"`: query topics with Spark SQL, each topic a view."""

from __future__ import annotations

import argparse
import sys
from typing import Any

_LOCATION_FLAGS = (
    ("--data-dir", "embedded stores of a broker started with --data-dir"),
    ("--s3-endpoint", "S3 endpoint URL"),
    ("--s3-bucket", "S3 bucket"),
    ("--s3-region", "S3 region"),
    ("--s3-namespace", "key prefix inside the bucket (default: default)"),
    ("--s3-access-key", "S3 access key (else KAFSCALE_S3_ACCESS_KEY or the AWS chain)"),
    ("--s3-secret-key", "S3 secret key"),
    ("--etcd-endpoints", "comma-separated etcd endpoints"),
    ("--etcd-prefix", "key prefix in etcd (default /kafscale/)"),
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("sql", help="run a Spark SQL query over topics (each topic is a view)")
    parser.add_argument("query", help="e.g. \"SELECT CAST(value AS STRING) FROM orders"
                                      " WHERE timestamp > now() - INTERVAL 1 HOUR\"")
    for flag, text in _LOCATION_FLAGS:
        parser.add_argument(flag, help=text)
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table", help="output format")
    parser.add_argument("--limit", type=int, default=1000, help="rows printed at most (default 1000)")
    parser.add_argument("--master", help="Spark master (default local[2], or $SPARK_MASTER)")
    parser.add_argument("--isolation-level", choices=("read_committed", "read_uncommitted"), default="read_committed",
                        help="read_committed (default): only committed transactions, up to the last stable offset;"
                             " read_uncommitted: every record up to the high watermark, aborted ones included")
    parser.set_defaults(run=run)


def location_options(args: argparse.Namespace) -> dict[str, str]:
    """--s3-bucket → kafscale.s3.bucket, and so on."""
    out = {}
    for flag, _ in _LOCATION_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value:
            out["kafscale." + flag[2:].replace("-", ".")] = value
    return out


def run(args: argparse.Namespace) -> int:
    from kafscale.commands.extras import require_pipeline_extra

    if (code := require_pipeline_extra("kafscale sql")) is not None:
        return code
    from kafscale.pipeline.location import Location
    from kafscale.pipeline.sql import print_rows, run_query

    options = {**location_options(args), "kafka.isolation.level": args.isolation_level}
    try:
        Location.from_options(options)
    except ValueError as e:
        print(f"kafscale sql: {e}", file=sys.stderr)
        return 2
    from kafscale.pipeline.session import owned_session

    with owned_session("kafscale-sql", args.master) as spark:
        df = run_query(spark, args.query, options)
        print_rows(df, args.format, args.limit, sys.stdout)
    return 0
