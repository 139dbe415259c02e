"""Session-wide fixtures: real servers started once per test session on free loopback ports."""

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.etcd",
    "tests.fixtures.ray",
    "tests.fixtures.spark",
]
