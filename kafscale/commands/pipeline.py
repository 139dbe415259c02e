"""`kafscale pipeline run CONFIG.yaml`: copy topics into Parquet or Iceberg tables with Spark, exactly once."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time, so a handler outliving a redirected stream stays valid."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("pipeline", help="run the table processor (topics → Parquet/Iceberg tables)")
    actions = parser.add_subparsers(dest="action", required=True)
    run_parser = actions.add_parser("run", help="run the pipeline described by a YAML file")
    run_parser.add_argument("config", help="pipeline YAML (see docs/pipeline.md)")
    run_parser.add_argument("--trigger", help="override the file's trigger: available-now, once, or '10 seconds'")
    run_parser.add_argument("--master", help="Spark master (default local[2], or $SPARK_MASTER)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kafscale.commands.extras import require_pipeline_extra

    if (code := require_pipeline_extra("kafscale pipeline")) is not None:
        return code
    from kafscale.pipeline.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"kafscale pipeline: {e}", file=sys.stderr)
        return 2
    # Progress of our own loggers only: Spark's and py4j's INFO chatter stays off.
    ours = logging.getLogger("kafscale")
    if not ours.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)
    from kafscale.pipeline.runner import run_pipeline
    from kafscale.pipeline.session import owned_session

    try:
        with owned_session(f"kafscale-pipeline-{cfg.name}", args.master, cfg.spark) as spark:
            written = run_pipeline(spark, cfg, trigger=args.trigger)
    except KeyboardInterrupt:
        return 130
    for table, rows in written.items():
        print(f"{table}: {rows} rows appended")
    return 0
