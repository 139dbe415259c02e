"""`kafscale bench`: the benchmarks of a source checkout, through the installed command."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

import kafscale
from kafscale.commands import bench


def test_kafscale_bench_passes_every_argument_to_the_benchmarks() -> None:
    listed = subprocess.run([sys.executable, "-m", "kafscale.cli", "bench", "--list"], capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert {"limits", "produce", "kcat_spec", "scale"} <= set(listed.stdout.split())

    helped = subprocess.run([sys.executable, "-m", "kafscale.cli", "bench", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert helped.returncode == 0 and "python -m benchmarks" in helped.stdout and "--scenario" in helped.stdout

    wrong = subprocess.run([sys.executable, "-m", "kafscale.cli", "bench", "--no-such-option"], capture_output=True,
                           text=True, timeout=120)
    assert wrong.returncode == 2 and "--no-such-option" in wrong.stderr


def test_kafscale_bench_outside_a_checkout_says_where_the_benchmarks_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.checkout() == Path(__file__).resolve().parents[2]  # this repository (tests/unit/ is two down)
    installed = tmp_path / "site-packages" / "kafscale"
    installed.mkdir(parents=True)
    monkeypatch.setattr(kafscale, "__file__", str(installed / "__init__.py"))  # as a wheel installs it
    assert bench.run(argparse.Namespace(args=["--list"])) == 2
    err = capsys.readouterr().err
    assert "no benchmarks/" in err and "make bench" in err and str(installed) in err
