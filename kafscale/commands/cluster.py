"""`kafscale cluster info`: cluster id, controller, brokers (shards) and topic count."""

from __future__ import annotations

import argparse
from typing import Any

from kafscale.commands.client import add_common, admin, emit, run_command, table, wait


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("cluster", help="what the cluster looks like")
    sub = parser.add_subparsers(dest="cluster_command", required=True)
    p = sub.add_parser("info", help="cluster id, controller, brokers, topics")
    add_common(p)
    p.set_defaults(run=run_command(info))


def info(args: argparse.Namespace) -> int:
    client = admin(args)
    described = wait(client.describe_cluster(request_timeout=args.timeout), args, "describe cluster")
    md = client.list_topics(timeout=args.timeout)
    data = {
        "cluster_id": described.cluster_id,
        "controller": described.controller.id if described.controller else None,
        "brokers": [{"id": n.id, "host": n.host, "port": n.port} for n in sorted(described.nodes, key=lambda n: n.id)],
        "topics": len([t for t in md.topics if not t.startswith("__")]),
        "partitions": sum(len(t.partitions) for name, t in md.topics.items() if not name.startswith("__")),
    }

    def text(d: dict[str, Any]) -> str:
        return (f"cluster {d['cluster_id']}: {len(d['brokers'])} broker(s), controller {d['controller']},"
                f" {d['topics']} topic(s), {d['partitions']} partition(s)\n\n"
                + table([[b["id"], b["host"], b["port"]] for b in d["brokers"]], ["BROKER", "HOST", "PORT"]))
    emit(args, data, text)
    return 0
