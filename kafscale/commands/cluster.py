"""`kafscale cluster info|stop|drain|rebalance` and `kafscale partition move`.

`cluster info` asks the brokers over Kafka's admin API (cluster id, brokers, topic count); given a Ray
cluster (--ray-address, or --data-dir of a detached serve) it asks the controller instead, which knows the
nodes and where every partition and group lives. The other commands are the controller's.
"""

from __future__ import annotations

import argparse
from typing import Any

from kafscale.commands.client import add_common, admin, emit, run_command, table, wait
from kafscale.commands.control import add_cluster_address, call, head_file, ray_address


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("cluster", help="what the cluster looks like; stop, drain and rebalance it")
    sub = parser.add_subparsers(dest="cluster_command", required=True)
    p = sub.add_parser("info", help="cluster id, brokers, topics; with --ray-address: nodes, shards, partitions"
                                    " and groups")
    add_common(p)
    p.add_argument("--ray-address", default="", help="ask the controller of this Ray cluster ('auto' works)")
    p.add_argument("--data-dir", default="", help="ask the controller of the detached serve that uses this directory")
    p.set_defaults(run=run_command(info))

    p = sub.add_parser("stop", help="stop the brokers gracefully: flush, release, end the actors")
    add_cluster_address(p)
    p.set_defaults(run=run_command(stop))

    p = sub.add_parser("drain", help="move every partition and group off one node's shards (before taking it down)")
    p.add_argument("--node", required=True, help="the node's IP, or a prefix (6+ characters) of its Ray node id")
    add_cluster_address(p)
    p.set_defaults(run=run_command(drain))

    p = sub.add_parser("rebalance", help="even partitions and group slots out over the live shards")
    add_cluster_address(p)
    p.set_defaults(run=run_command(rebalance))

    parser = commands.add_parser("partition", help="move a partition to another shard")
    sub = parser.add_subparsers(dest="partition_command", required=True)
    p = sub.add_parser("move", help="hand a partition to another shard (it flushes first: nothing is lost)")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("--to", type=int, required=True, dest="target", help="the shard (broker id) to lead it")
    add_cluster_address(p)
    p.set_defaults(run=run_command(move))


def info(args: argparse.Namespace) -> int:
    if args.ray_address or (args.data_dir and head_file(args) is not None):
        return cluster_layout(args)
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


def cluster_layout(args: argparse.Namespace) -> int:
    data = call(args, "info")

    def text(d: dict[str, Any]) -> str:
        lines = []
        for node in d["nodes"]:
            lines.append(f"node {node['node_ip']} ({node['node_id'][:12] or 'gone'})")
            for s in node["shards"]:
                state = ("live" if s["live"] else "NOT LIVE") + (", drained" if s.get("draining") else "")
                lines.append(f"  shard {s['id']} at {s['host']}:{s['port']} ({state}): {len(s['partitions'])}"
                             f" partition(s), {len(s['groups'])} group(s) in {len(s['group_slots'])} slot(s)")
                if s["partitions"]:
                    lines.append("    partitions: " + " ".join(s["partitions"]))
                if s["groups"]:
                    lines.append("    groups: " + " ".join(s["groups"]))
        meta = d.get("metadata")
        if meta:
            lines.append(f"metadata store: revision {meta['revision']}, compacted to {meta['compacted_revision']},"
                         f" {meta['db_bytes']:,} bytes on disk")
        return "\n".join(lines)
    emit(args, data, text)
    return 0


def _moves_text(moves: list[dict[str, Any]]) -> str:
    if not moves:
        return "nothing to move"
    rows = [[m["topic"] or "(groups)", m["partition"] if m["topic"] else m["group_slot"], m["from"], m["to"],
             "yes" if m["moved"] else "skipped", f"{m['seconds']:.3f}"] for m in moves]
    return table(rows, ["TOPIC", "PARTITION/SLOT", "FROM", "TO", "MOVED", "SECONDS"])


def stop(args: argparse.Namespace) -> int:
    from kafscale.actors.local_head import end_session
    from kafscale.commands.control import controller

    head = head_file(args) if not args.ray_address else None
    ray_address(args)  # fails early with a clear message if there is nothing to stop
    with controller(args) as handle:
        import ray  # only now: controller() sets what Ray reads at import

        ray.get(handle.stop.remote(), timeout=max(args.timeout, 90))
        ray.kill(handle, no_restart=True)
    if head is not None:  # a detached local head: it was ours to start, so it is ours to end
        end_session(int(head["pgid"]))
        from pathlib import Path

        from kafscale.actors.serve import HEAD_FILE

        Path(args.data_dir, HEAD_FILE).unlink(missing_ok=True)
    emit(args, {"stopped": True}, lambda _: "stopped")
    return 0


def drain(args: argparse.Namespace) -> int:
    moves = call(args, "drain", args.node)
    emit(args, moves, _moves_text)
    return 0 if all(m["moved"] for m in moves) else 1


def rebalance(args: argparse.Namespace) -> int:
    moves = call(args, "rebalance")
    emit(args, moves, _moves_text)
    return 0


def move(args: argparse.Namespace) -> int:
    result = call(args, "move", args.topic, args.partition, args.target)
    emit(args, result, lambda m: _moves_text([m]))
    return 0 if result["moved"] or result["from"] == result["to"] else 1
