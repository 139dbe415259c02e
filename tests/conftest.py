"""Session-wide fixtures: real servers started once per test session on free loopback ports."""

import os
from pathlib import Path

import pytest

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

UNIT_DIR = Path(__file__).parent / "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything outside tests/unit is an integration test: `pytest -m "not integration"` runs the unit tests."""
    for item in items:
        if not item.path.is_relative_to(UNIT_DIR):
            item.add_marker(pytest.mark.integration)
