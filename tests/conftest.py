"""Session-wide fixtures: real servers started once per test session on free loopback ports."""

import os
import sys
from pathlib import Path

import pytest

from tests.xdist_groups import REFERENCE_GROUP

# gRPC (etcd's client, Ray) installs fork handlers in this process. PySpark starts its JVM with a
# preexec_fn, i.e. a real fork() that runs them; with gRPC threads busy the child aborted before exec
# ("skipping fork() handlers", SIGABRT) and every Spark test errored. No child of this process uses gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# Every `kafscale serve` a test starts serves its console on a free port, never on the default 8080 that a
# developer's own broker (or another test's) may hold.
os.environ.setdefault("KAFSCALE_CONSOLE_LISTEN", "127.0.0.1:0")

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.etcd",
    "tests.fixtures.ray",
    "tests.fixtures.spark",
    "tests.fixtures.kafka_reference",
]

TESTS = Path(__file__).parent
UNIT_DIR = TESTS / "unit"
# `make test` runs the suite on two pytest-xdist workers (--dist loadgroup). Tests that share one expensive server,
# or that run whole Ray clusters, go to one worker as a group: each of those servers starts once per run, and no
# two Ray clusters or `kafscale serve` processes compete for the two cores.
PROCESS_DIRS = (TESTS / "cluster",)
# Spark tests join the reference's group: Spark's own Kafka source reads both brokers, and one worker then holds the
# run's one Spark session and its one reference Kafka.
FIXTURE_GROUPS = {"kafka_reference": REFERENCE_GROUP, "kafka_reference_39": REFERENCE_GROUP, "spark": REFERENCE_GROUP,
                  "ray_runtime": "ray"}


def _runs_processes(item: pytest.Item) -> bool:
    """Whether the test's module starts `kafscale serve` or a Ray cluster of its own."""
    from kafscale.testing.ray_cluster import RayTestCluster
    from kafscale.testing.serve_process import ServeProcess

    module = getattr(item, "module", None)
    return any(item.path.is_relative_to(d) for d in PROCESS_DIRS) or any(
        value in (ServeProcess, RayTestCluster) for value in vars(module).values()) if module else False


def xdist_group(item: pytest.Item) -> str | None:
    if item.get_closest_marker("xdist_group"):
        return None  # the test names its group itself (tests.xdist_groups.on_reference)
    if item.path.is_relative_to(TESTS / "jvm"):
        return REFERENCE_GROUP  # one broker with its listeners, one compiled driver, and the reference Kafkas
    if _runs_processes(item):
        return "processes"
    return next((FIXTURE_GROUPS[f] for f in getattr(item, "fixturenames", ()) if f in FIXTURE_GROUPS), None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything outside tests/unit is an integration test: `pytest -m "not integration"` runs the unit tests.
    First of the hooks: pytest-xdist's own (on each worker) reads the xdist_group marks to name the groups."""
    for item in items:
        if not item.path.is_relative_to(UNIT_DIR):
            item.add_marker(pytest.mark.integration)
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


class GroupCheck:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """On an xdist worker with --dist loadgroup, xdist has tagged each grouped test's node id with its group
        by now. With pytest 9.2 and xdist 3.8 it silently could not: every test went anywhere, two Ray clusters
        or JVM brokers ran at once, and each worker started its own reference Kafka. Stop then, rather than run
        so."""
        if not getattr(config.option, "loadgroup", False):
            return
        untagged = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if untagged:
            message = (f"pytest-xdist did not group {untagged[0]} (and {len(untagged) - 1} more): pytest "
                       f"{pytest.__version__} and this pytest-xdist do not work together")
            print(message, file=sys.__stderr__, flush=True)  # xdist shows a worker's UsageError as its own assert
            raise pytest.UsageError(message)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(GroupCheck(), "kafscale-group-check")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """KAFSCALE_TEST_FAILURES=FILE: each failure's test id and phase, appended as it happens (a long run's -q output
    names its failures only at the end, and on two workers not even in order)."""
    path = os.environ.get("KAFSCALE_TEST_FAILURES")
    if path and report.failed:
        with open(path, "a") as out:
            out.write(f"{report.when}\t{report.nodeid}\n")
