"""Every `module.NAME` a benchmark script reads from one of the project's own modules exists: most benchmarks run only
on a lent GPU, where a renamed constant costs a device call to find (2026-12-03: sweep_mamba2 read
mamba2.BUFFER_CAPACITY, renamed ENGINE_FLUSH_LENGTH, and lost its step of the call). Checked statically on the CPU."""

import ast
import importlib
import types
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
OWN = ("benchmarks", "verify_kernels", "specdec", "drafters")


def own_module_references(name: str) -> list[tuple[str, str, types.ModuleType]]:
    """(alias, attribute, module) for every `alias.attribute` in benchmarks/NAME.py where alias names one of the
    project's modules in the script's namespace."""
    script = importlib.import_module(f"benchmarks.{name}")
    tree = ast.parse((BENCHMARKS / f"{name}.py").read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = getattr(script, node.value.id, None)
            if isinstance(target, types.ModuleType) and target.__name__.startswith(OWN):
                found.append((node.value.id, node.attr, target))
    return found


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem != "__init__"))
def test_benchmark_reads_only_names_that_exist(name):
    missing = [f"{alias}.{attribute}" for alias, attribute, module in own_module_references(name)
               if not hasattr(module, attribute)]
    assert not missing, f"benchmarks/{name}.py reads names its modules lack: {missing}"


def test_the_check_sees_module_attributes():
    """sweep_mamba2 reads mamba2.ENGINE_FLUSH_LENGTH: the scan finds it (a scan that found nothing would pass)."""
    assert ("mamba2", "ENGINE_FLUSH_LENGTH") in {(a, n) for a, n, _ in own_module_references("sweep_mamba2")}
