"""A 3-node Ray test cluster (every node on 127.0.0.1, 1 CPU each) per test module, shared by its tests:
nodes are cheap to kill, not to start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafscale.testing.ray_cluster import RayTestCluster
from tests.cluster.clients import close_leftovers

NODES = 3


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayTestCluster]:
    with RayTestCluster(nodes=NODES, cpus_per_node=1) as cluster:
        yield cluster


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """No client of a test outlives it (a failed assertion skips the test's own stops): stopped here, before
    the fixtures' teardown stops the servers they talk to."""
    close_leftovers()
