"""Every module of benchmarks/ imports on a machine without a GPU: a name one of them takes from another that is
gone (a renamed or removed constant) fails here, not in the first minutes of a device call, where device time is
the scarce resource."""

import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("name", sorted(path.stem for path in BENCHMARKS.glob("*.py") if path.stem != "__init__"))
def test_benchmark_module_imports(name):
    importlib.import_module(f"benchmarks.{name}")
