"""What the client commands share (topic, group, produce, consume, cluster): connection flags, output as
text or JSON, errors that say what to do, and a progress bar on stderr.

They speak the Kafka protocol through confluent-kafka, so they work against any Kafka cluster too.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

DEFAULT_BOOTSTRAP = "localhost:9092"
ENV_BOOTSTRAP = "KAFSCALE_BOOTSTRAP_SERVER"


class CommandError(Exception):
    """Ends a command with this message on stderr and exit code 1."""


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-b", "--bootstrap-server", default=os.environ.get(ENV_BOOTSTRAP, DEFAULT_BOOTSTRAP),
                        help=f"HOST:PORT of a broker [env {ENV_BOOTSTRAP}; default {DEFAULT_BOOTSTRAP}]")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format")
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the cluster")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the Kafka client's own log")
    parser.add_argument("-X", dest="client_config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka client setting (repeatable)")


def client_config(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    # librdkafka logs every failed connection attempt; the commands say what went wrong themselves.
    quiet = logging.getLogger("kafscale.cli.librdkafka")
    quiet.setLevel(logging.DEBUG if args.verbose else logging.CRITICAL)
    if args.verbose and not quiet.handlers:
        quiet.addHandler(logging.StreamHandler())
    conf: dict[str, Any] = {"bootstrap.servers": args.bootstrap_server, "client.id": "kafscale-cli",
                            "logger": quiet, **extra}
    for item in args.client_config:
        key, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"-X {item!r}: expected KEY=VALUE, e.g. -X security.protocol=plaintext")
        conf[key] = value
    return conf


def admin(args: argparse.Namespace) -> Any:
    from confluent_kafka.admin import AdminClient

    client = AdminClient(client_config(args))
    reachable(client, args)
    return client


def reachable(client: Any, args: argparse.Namespace) -> Any:
    """Metadata of the cluster, or a CommandError telling how to point at a running broker."""
    from confluent_kafka import KafkaException

    try:
        return client.list_topics(timeout=args.timeout)
    except KafkaException as e:
        raise CommandError(
            f"cannot reach a broker at {args.bootstrap_server} ({e.args[0].str()}).\n"
            f"  Is `kafscale serve` running? Point elsewhere with --bootstrap-server HOST:PORT"
            f" or {ENV_BOOTSTRAP}.") from None


def wait(future: Any, args: argparse.Namespace, what: str, hints: dict[str, str] | None = None) -> Any:
    """A confluent-kafka future's result; its Kafka error turned into a message with a hint."""
    from confluent_kafka import KafkaException

    try:
        return future.result(timeout=args.timeout)
    except KafkaException as e:
        err = e.args[0]
        name = err.name() if hasattr(err, "name") else str(err)
        hint = (hints or {}).get(name) or HINTS.get(name, "")
        message = err.str() if hasattr(err, "str") else str(err)
        raise CommandError(f"{what}: {message}" + (f"\n  {hint}" if hint else "")) from None
    except TimeoutError:
        raise CommandError(f"{what}: no answer within {args.timeout}s (raise --timeout?)") from None


HINTS = {
    "TOPIC_ALREADY_EXISTS": "Change it with `kafscale topic alter`, or delete it first.",
    "UNKNOWN_TOPIC_OR_PART": "List topics with `kafscale topic list`.",
    "INVALID_CONFIG": "Supported topic configs: `kafscale topic describe TOPIC` lists them.",
    "INVALID_PARTITIONS": "Partitions can only be added: give a count above the current one.",
    "POLICY_VIOLATION": "The broker refused the change; see the message above.",
    "GROUP_ID_NOT_FOUND": "List groups with `kafscale group list`.",
    "NON_EMPTY_GROUP": "Stop the group's consumers first (the group must be empty).",
}


def parse_pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def emit(args: argparse.Namespace, data: Any, text: Callable[[Any], str], out: TextIO | None = None) -> None:
    """Print data as JSON (--output json) or as text(data)."""
    out = out or sys.stdout
    if args.output == "json":
        out.write(json.dumps(data, indent=None if isinstance(data, dict | list) and len(data) < 2 else 2) + "\n")
    else:
        rendered = text(data)
        if rendered:
            out.write(rendered.rstrip("\n") + "\n")
    out.flush()


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def run_command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wraps a command: CommandError → message on stderr, exit 1; Ctrl-C → exit 130."""
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except CommandError as e:
            print(f"kafscale: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
    return run


class Progress:
    """A one-line progress bar on stderr: shown when stderr is a terminal, or when forced (--progress)."""

    def __init__(self, label: str, total: int | None = None, *, enabled: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label, self.total, self.done = label, total, 0
        self.started = time.monotonic()
        self._last_draw = 0.0

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last_draw >= 0.1 or self.done == self.total):
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self.started, 1e-6)
        if self.total:
            filled = int(30 * min(self.done / self.total, 1))
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}"
        else:
            bar = f"{self.done}"
        self.stream.write(f"\r{self.label} {bar} ({rate:,.0f}/s)")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()


def add_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: when stderr is a terminal)")
