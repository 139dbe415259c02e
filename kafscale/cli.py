"""The `kafscale` command line."""

from __future__ import annotations

import argparse
import sys

from kafscale import __version__, config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafscale", description="Kafka-compatible streaming on object storage")
    parser.add_argument("--version", action="version", version=f"kafscale {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run a broker (shards on Ray)")
    config.add_arguments(serve_parser)
    args = parser.parse_args(argv)

    if args.command == "serve":
        from kafscale.logs import setup_logging
        from kafscale.serve import serve

        try:
            settings = config.load(args)
        except config.ConfigError as e:
            print(f"kafscale: {e}", file=sys.stderr)
            return 2
        setup_logging(settings.log_level, settings.log_json)
        return serve(settings)
    return 1


if __name__ == "__main__":
    sys.exit(main())
