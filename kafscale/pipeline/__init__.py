"""The data pipeline: Spark reads topics straight from committed segments, and writes them to tables.

`register(spark)` makes `spark.read.format("kafscale")`, `spark.readStream.format("kafscale")` and
`df.write.format("kafscale")` available; `spark_session()` builds a local session that has it.
See docs/pipeline.md.
"""

from __future__ import annotations

from kafscale.pipeline.session import register, spark_session

__all__ = ["register", "spark_session"]
