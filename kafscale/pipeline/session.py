"""A Spark session that can use the `kafscale` source: local by default, with what the source needs."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["SOURCE_CONF", "owned_session", "register", "spark_session"]

# Lets time, partition and offset predicates reach the source so that it can skip segments.
SOURCE_CONF = {"spark.sql.python.filterPushdown.enabled": "true"}


def register(spark: Any) -> Any:
    from kafscale.pipeline.source import KafscaleDataSource

    for key, value in SOURCE_CONF.items():
        spark.conf.set(key, value)
    spark.dataSource.register(KafscaleDataSource)
    return spark


def spark_session(app_name: str = "kafscale", master: str | None = None, conf: dict[str, str] | None = None) -> Any:
    """getOrCreate() a session and register the source. Python workers must run this interpreter (it has
    kafscale and pyarrow), and a local Spark should stay on loopback."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(master or os.environ.get("SPARK_MASTER", "local[2]"))
    settings = {"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC", **SOURCE_CONF, **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    return register(builder.getOrCreate())


class owned_session:
    """A session for a command: the one already running in this process (left running), or a new one that is
    stopped on exit."""

    def __init__(self, app_name: str, master: str | None = None, conf: dict[str, str] | None = None) -> None:
        self.args = (app_name, master, conf)
        self.created = False
        self.spark: Any = None

    def __enter__(self) -> Any:
        from pyspark.sql import SparkSession

        existing = SparkSession.getActiveSession()
        self.created = existing is None
        self.spark = register(existing) if existing is not None else spark_session(*self.args)
        return self.spark

    def __exit__(self, *exc: object) -> None:
        if self.created:
            self.spark.stop()
