"""`kafscale bench [ARGS…]`: the benchmarks of a source checkout (`benchmarks/`, what `make bench` runs).

The benchmarks are not part of the installed package: they drive brokers, SeaweedFS and kcat from the
repository's own files. This command finds the checkout next to the imported `kafscale` package (an
editable install, as `make` makes) and runs `python -m benchmarks ARGS…` there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import kafscale


def add_parser(commands: Any) -> None:
    # No options of its own (prefix_chars without "-"): every argument, --help included, goes to the benchmarks.
    parser = commands.add_parser(
        "bench", add_help=False, prefix_chars="+",
        help="run the benchmarks of a source checkout (kafscale bench --help; see docs/performance.md)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed to python -m benchmarks")
    parser.set_defaults(run=run)


def checkout() -> Path | None:
    """The repository holding the imported kafscale package, if it has the benchmarks."""
    root = Path(kafscale.__file__).resolve().parent.parent
    return root if (root / "benchmarks" / "__main__.py").is_file() else None


def run(args: argparse.Namespace) -> int:
    root = checkout()
    if root is None:
        print("kafscale bench: no benchmarks/ next to the installed kafscale package "
              f"({Path(kafscale.__file__).resolve().parent}); they run from a source checkout: "
              "git clone the repository and run `make bench` (or `kafscale bench`) there", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", "benchmarks", *args.args], cwd=root)
