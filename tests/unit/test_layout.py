"""The house rules of the source tree, checked on every run (issue 20's "done when"): the
import graph of ``stackflow`` has no circles, no file is over 600 lines, no module imports
another module's ``_private`` name, no workflow names an activity by string, and patches are
asked only through ``stackflow.workflows.patches`` (which settles the baseline first).

The import graph is what importing a module runs: its module-level imports (in ``if``/``try``
blocks and class bodies too), not those for type checkers only (``if TYPE_CHECKING:``) nor
those deferred into a function (a runtime's cheap rules create the runtime on first use)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "stackflow"
MAX_LINES = 600


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {_module(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if FILES[module].name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _type_checking(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_at_import(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of ``body`` that run when the module is imported."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or _type_checking(node):
            continue
        out.append(node)
        blocks = [getattr(node, f, []) for f in ("body", "orelse", "finalbody")]
        blocks += [handler.body for handler in getattr(node, "handlers", [])]
        for block in blocks:
            out.extend(_run_at_import(block))
    return out


def _imports(module: str, *, all_of_them: bool = False) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) of the imports ``module`` runs when it
    is imported, or of every import in it (``all_of_them``)."""
    tree = ast.parse(FILES[module].read_text())
    found: list[tuple[str, str | None, int]] = []
    nodes = ast.walk(tree) if all_of_them else iter(_run_at_import(tree.body))
    for node in nodes:
        if isinstance(node, ast.Import):
            found.extend((alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for alias in node.names:
                if f"{target}.{alias.name}" in FILES:  # a submodule, not a name
                    found.append((f"{target}.{alias.name}", None, node.lineno))
                else:
                    found.append((target, alias.name, node.lineno))
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the stackflow modules it imports."""
    graph: dict[str, set[str]] = {}
    for module in FILES:
        graph[module] = set()
        for target, _, _ in _imports(module):
            while target and target not in FILES:
                target = target.rpartition(".")[0]
            # a package's own submodules importing it (``from stackflow.x import y`` inside
            # stackflow.x.z) is how a package is laid out, not a circle between modules
            if target and target != module and not module.startswith(f"{target}."):
                graph[module].add(target)
    return graph


def test_the_package_is_read_whole() -> None:
    assert {
        "stackflow.engine.diff",
        "stackflow.engine.masking",
        "stackflow.workflows.apply",
    } <= FILES.keys()
    assert sum(len(edges) for edges in _graph().values()) > len(FILES)


def test_the_import_graph_has_no_circles() -> None:
    try:
        TopologicalSorter(_graph()).prepare()
    except CycleError as err:
        pytest.fail(f"an import circle: {' -> '.join(err.args[1])}")


@pytest.mark.parametrize("module", sorted(FILES))
def test_no_file_is_over_600_lines(module: str) -> None:
    lines = len(FILES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{FILES[module]} has {lines} lines"


def test_no_module_imports_another_modules_private_name() -> None:
    private = [
        f"{module}:{line} imports {target}.{name}"
        for module in FILES
        for target, name, line in _imports(module, all_of_them=True)
        if target.startswith("stackflow")
        and name is not None
        and name.startswith("_")
        and not name.startswith("__")
    ]
    assert private == []


def test_workflows_name_no_activity_by_string() -> None:
    by_string = []
    for module, path in FILES.items():
        if not module.startswith("stackflow.workflows"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr.startswith(("execute_activity", "start_activity"))
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                by_string.append(f"{path.name}:{node.lineno}")
    assert by_string == []


def test_patches_are_asked_through_the_baseline() -> None:
    """``workflow.patched`` is called in ``stackflow.workflows.patches`` only: a patch asked
    directly could be seen false before its baseline is settled true (see that module)."""
    direct = []
    for module, path in FILES.items():
        if module == "stackflow.workflows.patches":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("patched", "deprecate_patch")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "workflow"
            ):
                direct.append(f"{path.name}:{node.lineno}")
    assert direct == []


def _every_import_graph(prefixes: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules it imports anywhere (deferred into functions, for type checkers
    too), for the modules under ``prefixes``."""
    graph: dict[str, set[str]] = {}
    for module in FILES:
        if not module.startswith(prefixes):
            continue
        graph[module] = set()
        for target, _, _ in _imports(module, all_of_them=True):
            while target and target not in FILES:
                target = target.rpartition(".")[0]
            inside = module.startswith(f"{target}.")  # a package's own layout
            if target.startswith(prefixes) and target != module and not inside:
                graph[module].add(target)
    return graph


def test_the_cli_and_the_client_take_part_in_no_circle_counting_every_import() -> None:
    try:
        TopologicalSorter(_every_import_graph(("stackflow.cli", "stackflow.client"))).prepare()
    except CycleError as err:
        pytest.fail(f"an import circle: {' -> '.join(err.args[1])}")


def test_the_client_imports_neither_the_server_nor_the_engine() -> None:
    """``stackflow.client`` is the CLI's only transport and the server's answers' types: it
    imports the standard library and ``stackflow.core.errors`` only (the server imports it)."""
    found = {
        f"{module} imports {target}"
        for module in FILES
        if module.startswith("stackflow.client")
        for target, _, _ in _imports(module, all_of_them=True)
        if target.startswith("stackflow.")
        and not target.startswith(("stackflow.client", "stackflow.core.errors"))
    }
    assert found == set()
