"""The release guard: every figure of a run beside the same figure at the last release.

`benchmarks/release.json` keeps the medians of the last release, one set per mode (`full`, `quick`), keyed
"scenario/name[backend]". After a run, each figure that the release also has is printed with its ratio to it;
a figure worse than the release by more than DROP (lower for a rate, higher for a time or a cost) is named as a
drop. `python -m benchmarks --save-release` writes the run's figures as the release's, at a release.

The limits (loopback TCP, raw store PUT/GET) are compared too: when they moved as much as the broker's figures,
the machine changed, not the code.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RELEASE = Path(__file__).with_name("release.json")
DROP = 0.10


@dataclass(frozen=True, slots=True)
class Comparison:
    key: str
    unit: str
    value: float
    release: float
    ratio: float  # value / release
    drop: bool  # worse than the release by more than DROP


def higher_is_better(unit: str) -> bool:
    """Rates (MiB/s, records/s, msg/s) are better higher; times, sizes and costs per record lower."""
    return unit.endswith("/s")


def figure_key(result: dict[str, Any]) -> str:
    return f"{result['scenario']}/{result['name']}[{result['backend']}]"


def _mode(quick: bool) -> str:
    return "quick" if quick else "full"


def load(path: Path = RELEASE) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def compare(results: list[dict[str, Any]], quick: bool, release: dict[str, Any]) -> list[Comparison]:
    figures = release.get(_mode(quick), {}).get("figures", {})
    out = []
    for r in results:
        then = figures.get(figure_key(r))
        if then is None or r["value"] is None or not then["value"]:
            continue
        ratio = r["value"] / then["value"]
        drop = ratio < 1 - DROP if higher_is_better(r["unit"]) else ratio > 1 + DROP
        out.append(Comparison(figure_key(r), r["unit"], r["value"], then["value"], round(ratio, 3), drop))
    return out


def describe(comparisons: list[Comparison], release: dict[str, Any], quick: bool) -> list[str]:
    where = release.get(_mode(quick), {})
    lines = [f"against the release figures of {where.get('commit', '?')} ({where.get('date', '?')}, "
             f"{_mode(quick)} mode): {len(comparisons)} figures"]
    for c in comparisons:
        flag = f"  DROP: worse than the release by more than {DROP:.0%}" if c.drop else ""
        lines.append(f"  {c.key} = {c.value:,.3f} {c.unit}, release {c.release:,.3f} -> ratio {c.ratio}{flag}")
    return lines


def save(results: list[dict[str, Any]], quick: bool, path: Path = RELEASE) -> None:
    """Write this run's figures as the release's for its mode (the other mode's are kept)."""
    release = load(path)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=path.parent, check=False).stdout.strip()
    release[_mode(quick)] = {
        "commit": commit or "?",
        "date": results[0]["time"] if results else "",
        "figures": {figure_key(r): {"value": r["value"], "unit": r["unit"]}
                    for r in results if r["value"] is not None},
    }
    path.write_text(json.dumps(release, indent=1, sort_keys=True) + "\n")
