"""The benchmarks' release guard (benchmarks/guard.py): a figure worse than the release's by more than 10 % is a
drop, in the direction its unit says is worse; the saved release file round-trips."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import guard


def _result(name: str, value: float | None, unit: str, backend: str = "local") -> dict[str, Any]:
    return {"scenario": "read_back", "name": name, "backend": backend, "value": value, "unit": unit,
            "time": "2026-11-28T22:00:00+0000"}


def test_a_rate_that_fell_and_a_cost_that_rose_past_ten_percent_are_drops(tmp_path: Path) -> None:
    release_run = [_result("read_records_s", 100_000.0, "records/s"), _result("produce_records_s", 50_000.0,
                   "records/s"), _result("read_shard_cpu_us_per_record", 3.0, "us/record"),
                   _result("p99_ms", 10.0, "ms")]
    path = tmp_path / "release.json"
    guard.save(release_run, quick=False, path=path)
    release = guard.load(path)
    now = [_result("read_records_s", 85_000.0, "records/s"),          # 15 % slower: a drop
           _result("produce_records_s", 46_000.0, "records/s"),       # 8 % slower: within the noise allowed
           _result("read_shard_cpu_us_per_record", 3.5, "us/record"),  # 17 % more CPU: a drop
           _result("p99_ms", 8.0, "ms"),                              # faster: no drop
           _result("new_figure", 1.0, "MiB/s")]                       # not in the release: not compared
    compared = {c.key: c for c in guard.compare(now, quick=False, release=release)}
    assert sorted(k for k, c in compared.items() if c.drop) == [
        "read_back/read_records_s[local]", "read_back/read_shard_cpu_us_per_record[local]"]
    assert compared["read_back/produce_records_s[local]"].ratio == 0.92
    assert "read_back/new_figure[local]" not in compared
    assert guard.compare(now, quick=True, release=release) == []  # quick runs compare with quick figures only
    lines = guard.describe(list(compared.values()), release, quick=False)
    assert sum("DROP" in line for line in lines) == 2


def test_saving_one_mode_keeps_the_others_figures(tmp_path: Path) -> None:
    path = tmp_path / "release.json"
    guard.save([_result("read_records_s", 1.0, "records/s")], quick=True, path=path)
    guard.save([_result("read_records_s", 2.0, "records/s")], quick=False, path=path)
    saved = guard.load(path)
    assert saved["quick"]["figures"]["read_back/read_records_s[local]"]["value"] == 1.0
    assert saved["full"]["figures"]["read_back/read_records_s[local]"]["value"] == 2.0
