"""The `kafscale` command line: the subcommands live in kafscale.commands, one module per family."""

from __future__ import annotations

import argparse
import importlib
import sys

from kafscale import __version__
from kafscale.commands import COMMAND_MODULES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafscale", description="Kafka-compatible streaming on object storage")
    parser.add_argument("--version", action="version", version=f"kafscale {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
