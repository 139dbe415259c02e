"""Benchmarks, run with `make bench` (never inside the test suite)."""
