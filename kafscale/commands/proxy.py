"""`kafscale proxy`: virtual partitions in front of any Kafka-compatible cluster (docs/virtual-partitions.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("proxy", help="serve virtual partitions in front of a Kafka-compatible cluster")
    parser.add_argument("--upstream", required=True, metavar="HOST:PORT", help="a bootstrap broker of the cluster")
    parser.add_argument("--listen", default="127.0.0.1:9192", metavar="HOST:PORT",
                        help="where clients connect (default 127.0.0.1:9192; port 0 picks a free one)")
    parser.add_argument("--mapping", required=True, metavar="FILE",
                        help="the virtual partition mapping (the YAML of serve --virtual-partitions-mapping)")
    parser.add_argument("--advertise", metavar="HOST:PORT",
                        help="the address clients are told to use (default: the listen address)")
    parser.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus /metrics here")
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(run=run)


def _address(value: str | None, flag: str) -> tuple[str, int] | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{flag} must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def run(args: argparse.Namespace) -> int:
    from kafscale.cluster.virtual import MappingError, VirtualMapping
    from kafscale.logs import setup_logging
    from kafscale.proxy.server import ProxyServer
    from kafscale.proxy.server import run as serve

    try:
        mapping = VirtualMapping.load(args.mapping)
        upstream = _address(args.upstream, "--upstream")
        listen = _address(args.listen, "--listen")
        advertise = _address(args.advertise, "--advertise")
        metrics = _address(args.metrics, "--metrics")
        if advertise is None and listen is not None and listen[0] in ("0.0.0.0", "::", ""):
            raise ValueError(f"--listen {args.listen} binds every interface: say with --advertise HOST:PORT "
                             "which address clients should use")
    except (MappingError, ValueError) as e:
        print(f"kafscale proxy: {e}", file=sys.stderr)
        return 2
    assert upstream is not None and listen is not None
    setup_logging(args.log_level)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(ProxyServer(upstream, listen, mapping, advertise, metrics)))
    return 0
