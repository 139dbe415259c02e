"""Spark's own Kafka source (`spark.read.format("kafka")`), for sessions that compare it with kafscale's segment source.

pyspark ships without it. `tests/spark-kafka/pom.xml` copies its four jars (spark-sql-kafka-0-10, its token
provider, kafka-clients and commons-pool2) into `tests/spark-kafka/lib/<version>/` (`make spark-kafka`, which
`make test` and `make bench` run). They must be on `spark.jars` before the JVM starts, i.e. before the process's
first `getOrCreate()`: a running session cannot load them afterwards.

    spark_session("app", conf=spark_kafka_conf())
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ARTIFACTS", "SPARK_KAFKA_VERSION", "spark_kafka_conf", "spark_kafka_jars"]

# The spark.version of tests/spark-kafka/pom.xml: Maven Central's newest Spark Kafka source (it has none of 4.3.0,
# the installed pyspark's version; 4.2.0's works on it).
SPARK_KAFKA_VERSION = "4.2.0"
ARTIFACTS = ("spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients", "commons-pool2")

REPO_ROOT = Path(__file__).resolve().parents[2]
LIB_ROOT = REPO_ROOT / "tests" / "spark-kafka" / "lib"


def spark_kafka_jars(lib_root: Path = LIB_ROOT) -> list[Path]:
    """The four jars; FileNotFoundError naming what is missing, and how to fetch it, when they are not there."""
    folder = lib_root / SPARK_KAFKA_VERSION
    jars = sorted(folder.glob("*.jar"))
    missing = [a for a in ARTIFACTS if not any(j.name.startswith(f"{a}-") for j in jars)]
    if missing:
        raise FileNotFoundError(
            f"Spark's Kafka source {SPARK_KAFKA_VERSION} is not installed: {folder} lacks {', '.join(missing)}. "
            f"Install it with `make spark-kafka` (which `make test` runs) or "
            f"`mvn -q -B -f {REPO_ROOT / 'tests/spark-kafka/pom.xml'} dependency:copy-dependencies`")
    return jars


def spark_kafka_conf(lib_root: Path = LIB_ROOT) -> dict[str, str]:
    """The session settings that put the source on the classpath of a session not started yet."""
    return {"spark.jars": ",".join(str(j) for j in spark_kafka_jars(lib_root))}
