"""`kafscale sql` and `kafscale pipeline` without the pipeline extra: a clear message and exit code, no traceback.

The extra is installed in the test environment, so its absence is simulated: a None entry in sys.modules is
how Python marks a module that cannot be imported.
"""

from __future__ import annotations

import sys

import pytest

from kafscale.cli import main
from kafscale.commands.extras import PIPELINE_MODULES, missing_modules


@pytest.mark.parametrize("argv", [["sql", "SELECT 1"], ["pipeline", "run", "does-not-matter.yaml"]])
def test_commands_name_the_extra_when_spark_is_missing(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)
    monkeypatch.setitem(sys.modules, "pyiceberg", None)
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"kafscale {argv[0]} needs the pipeline extra" in err
    assert "missing: pyspark, pyiceberg" in err
    assert "pip install 'kafscale[pipeline]'" in err
    assert "Traceback" not in err


def test_the_extra_is_installed_for_the_tests() -> None:
    assert missing_modules(PIPELINE_MODULES) == []
