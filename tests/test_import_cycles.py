"""No import cycles between the project's modules, read from the source with ast (nothing is imported).

Two graphs, each checked for cycles:
- units: the top-level packages (drafters, verify_kernels, benchmarks) and specdec's subpackages and root modules
  (specdec.engine, specdec.cache, specdec.api, ...), with every import, deferred ones in functions included: the
  layering (speculation below both engine and drafters, drafters never above the engine);
- import time: modules, with the imports that run when a module is first imported (module level, outside
  `if TYPE_CHECKING`). Importing a.b.c first runs a/__init__ and a/b/__init__, so an import of a.b.c depends on
  those too, except the ones the importer sits in (already running when it runs). A cycle here is an ImportError
  or a half-initialised module waiting to happen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specdec", "drafters", "verify_kernels", "benchmarks")


def project_modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path], at_import_time: bool) -> set[str]:
    """The project modules `name` imports (all of them, or those run at import time)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text()), at_import_time):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        targets.add(base)
        targets.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    return {target for target in targets if target in known and target != name}


def _import_nodes(tree: ast.Module, at_import_time: bool):
    if not at_import_time:
        yield from (node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom))
        return
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
        elif isinstance(node, ast.If | ast.Try | ast.With):  # run at import time; functions and classes' methods not
            pending.extend(ast.iter_child_nodes(node))


def ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def unit_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "specdec" and len(parts) > 1 else parts[0]


def unit_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        for target in imported(name, path, known, at_import_time=False):
            a, b = unit_of(name), unit_of(target)
            if a != b and "specdec" not in (a, b):  # the root __init__ names the API lazily: it is no unit
                graph.setdefault(a, set()).add(b)
    return graph


def import_time_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        running = set(ancestors(name))
        for target in imported(name, path, known, at_import_time=True):
            needed = [m for m in [*ancestors(target), target] if m in known and m not in running and m != name]
            graph.setdefault(name, set()).update(needed)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_project_has_no_import_cycles():
    known = project_modules(ROOT)
    assert "specdec.engine.engine" in known and "drafters.base" in known
    assert cycles(unit_graph(known)) == [], "import cycle between packages"
    assert cycles(import_time_graph(known)) == [], "import cycle at import time"


def test_drafters_never_import_the_engine_or_the_api():
    known = project_modules(ROOT)
    for name, path in known.items():
        if name.startswith("drafters"):
            above = {t for t in imported(name, path, known, False) if unit_of(t) in ("specdec.engine", "specdec.api")}
            assert not above, f"{name} imports {sorted(above)}"


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize("files, graph", [
    # two packages importing each other (in a function: still a layering cycle)
    ({"low/__init__.py": "", "low/a.py": "def f():\n    from high import b\n",
      "high/__init__.py": "", "high/b.py": "from low.a import f\n"}, unit_graph),
    # a package root that imports its API eagerly, while a package below the API imports the root's leaves
    ({"top/__init__.py": "from .api import run\n", "top/api.py": "from side.use import x\n", "top/leaf.py": "",
      "side/__init__.py": "from .use import x\n", "side/use.py": "from top.leaf import y\nx = 1\n"},
     import_time_graph),
])
def test_a_cycle_is_found(tmp_path, files, graph):
    write(tmp_path, files)
    known = project_modules(tmp_path, packages=sorted({name.split("/")[0] for name in files}))
    assert cycles(graph(known)), "the planted cycle went unnoticed"


def test_imports_in_functions_and_under_type_checking_run_later(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from pkg import b\ndef f():\n    from pkg import b\n", "pkg/b.py": "from pkg import a\n"})
    known = project_modules(tmp_path, packages=["pkg"])
    assert cycles(import_time_graph(known)) == []
