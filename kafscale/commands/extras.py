"""Optional parts of the install: the commands that need one say which extra to install when it is missing."""

from __future__ import annotations

import importlib.util
import sys

# What `pip install 'kafscale[pipeline]'` brings (pyproject.toml), as import names: Spark and the
# Arrow/pandas/NumPy stack it reads segments with, and pyiceberg for Iceberg tables.
PIPELINE_MODULES = ("pyspark", "pyarrow", "pandas", "numpy", "pyiceberg")


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that cannot be imported here (found without importing them)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or a module without a spec
            found = False
        if not found:
            missing.append(name)
    return missing


def require_pipeline_extra(command: str) -> int | None:
    """None when the pipeline extra is installed; else say what to install on stderr and return the exit
    code (1) for ``command`` (e.g. "kafscale sql") to end with."""
    missing = missing_modules(PIPELINE_MODULES)
    if not missing:
        return None
    print(
        f"{command} needs the pipeline extra, which is not installed (missing: {', '.join(missing)}):"
        " pip install 'kafscale[pipeline]'",
        file=sys.stderr,
    )
    return 1
