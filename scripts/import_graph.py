"""The import graph of stackflow's non-test code: module-level imports (not those under
``if TYPE_CHECKING:`` nor inside functions), and the circles in it.

    .venv/bin/python scripts/import_graph.py            # prints circles, exit 1 if any
    .venv/bin/python scripts/import_graph.py --edges    # prints every edge
    .venv/bin/python scripts/import_graph.py <repo>     # another checkout

An import names the module it reaches (``from a.b import c``: ``a.b``, or ``a.b.c`` when
that is a module), not the packages above it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("stackflow",)
TOP_MODULES: tuple[str, ...] = ()


def modules(repo: Path = REPO) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((repo / package).rglob("*.py")):
            parts = list(path.relative_to(repo).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    for name in TOP_MODULES:
        if (repo / f"{name}.py").exists():
            found[name] = repo / f"{name}.py"
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            out.extend(_module_level(node.body))
            out.extend(_module_level(node.orelse))
        elif isinstance(node, ast.Try):
            out.extend(_module_level(node.body))
            for handler in node.handlers:
                out.extend(_module_level(handler.body))
    return out


def edges(repo: Path = REPO) -> dict[str, set[str]]:
    known = modules(repo)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _module_level(ast.parse(path.read_text()).body):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                # the deepest known module the import names (a package's __init__ counts)
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
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
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    graph = edges(Path(args[0]).resolve() if args else REPO)
    if "--edges" in sys.argv:
        for name in sorted(graph):
            for target in sorted(graph[name]):
                print(f"{name} -> {target}")
    found = circles(graph)
    for component in found:
        print("circle: " + " <-> ".join(component))
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports, {len(found)} circles")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
