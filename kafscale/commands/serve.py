"""`kafscale serve`: run a broker (shards on Ray)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kafscale import config


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("serve", help="run a broker (shards on Ray)")
    config.add_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kafscale.actors.serve import serve
    from kafscale.cluster.virtual import MappingError, VirtualMapping
    from kafscale.logs import setup_logging

    try:
        settings = config.load(args)
        if settings.virtual_partitions_mapping:  # refused here, before any shard starts on it
            VirtualMapping.load(settings.virtual_partitions_mapping)
    except (config.ConfigError, MappingError) as e:
        print(f"kafscale: {e}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_json)
    return serve(settings)
