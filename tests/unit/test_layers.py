"""The import contract of pyproject.toml ([tool.importlinter]): packages import only packages below them, and the
Spark pipeline stays apart. The same check as `make lint`, so a broken layer fails the unit tests too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"  # installed by the `test` extra (import-linter)


def test_the_import_contract_holds() -> None:
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: pip install -e '.[test]' installs import-linter"
    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(REPO / "pyproject.toml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"lint-imports found imports against the layers:\n{result.stdout}{result.stderr}"
    assert "0 broken" in result.stdout, result.stdout
