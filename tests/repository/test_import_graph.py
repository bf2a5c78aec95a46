"""The import graph of the server (`service/`, `store/`) and the client: one-way, no circle.

Every module is parsed (never imported), and each `import X` or `from X import Y`
anywhere in it, inside functions too, is an edge to the module it names (`X.Y` when
that is a module, else `X`) and to the packages above it whose `__init__` importing
it runs. The graph must hold no cycle; `store/` imports nothing of `service/`, and
the client imports neither.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

from tests.support.paths import ROOT

# Each root directory and the top-level packages it holds.
SOURCES = {
    ROOT: ("service", "store"),
    ROOT / "clients" / "python" / "src": ("sessionstate_client",),
}
CLIENT = "sessionstate_client"


def module_files() -> dict[str, Path]:
    """Every module's dotted name and its file."""
    found = {}
    for root, packages in SOURCES.items():
        for package in packages:
            for path in sorted((root / package).rglob("*.py")):
                parts = list(path.relative_to(root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = path
    return found


def named_modules(name: str, path: Path, tree: ast.AST) -> Iterator[str]:
    """The dotted names a module's import statements name, relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            yield source
            yield from (f"{source}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    """Each module and the modules it imports."""
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for target in named_modules(name, path, tree):
            if target not in modules:
                continue
            parts = target.split(".")
            # Importing a.b.c runs a and a.b first; a package above this module already runs.
            for depth in range(1, len(parts) + 1):
                above = ".".join(parts[:depth])
                if above != name and not name.startswith(above + "."):
                    graph[name].add(above)
    return graph


def edges() -> list[tuple[str, str]]:
    return [(source, target) for source, targets in import_graph().items() for target in targets]


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "service.http.problems" in graph["service.app"]
    assert "sessionstate_client._calls" in graph["sessionstate_client.aio"]


def test_no_module_imports_one_that_imports_it_back() -> None:
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as error:
        circle = " -> ".join(error.args[1])
        raise AssertionError(f"an import circle: {circle}") from None


def test_the_store_imports_nothing_of_the_service() -> None:
    crossing = [
        (source, target)
        for source, target in edges()
        if source.partition(".")[0] == "store" and target.partition(".")[0] == "service"
    ]
    assert crossing == []


def test_the_client_imports_neither_the_service_nor_the_store() -> None:
    crossing = [
        (source, target)
        for source, target in edges()
        if source.partition(".")[0] == CLIENT and target.partition(".")[0] != CLIENT
    ]
    assert crossing == []
