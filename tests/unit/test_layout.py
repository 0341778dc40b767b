"""The house rules of the source tree, checked on every run: ``stackflow`` is packages in
one-way layers (a module imports only from its own layer or the ones below, in :data:`LAYERS`'s
order) with no import circle, no file is over 600 lines, no module imports another module's
``_private`` name, no workflow names an activity by string, and patches are asked only
through ``stackflow.workflows.patches`` (which settles the baseline first).

The import graph counts every import: module-level ones, those for type checkers only
(``if TYPE_CHECKING:``) and those deferred into a function. A deferred import still says the
importing module depends on the imported one; counting only what runs at import time let a
25-module circle stand while this test reported none."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "stackflow"
MAX_LINES = 600

LAYERS = (
    "core",  # errors, paths, refs, terminal, config, crypto: no stackflow import at all
    "model",  # the data: spec, release, source, policy, events, runtime rules
    "engine",  # pure logic over the models: spec loading and checks, graph, diff, masking
    "state",  # the system of record and its caches, git sources
    "temporal",  # workflow I/O models, wire, codec, client, tracing, metrics, queues
    "runtimes",  # the only code that touches infrastructure, and the worker policy
    "policy_gate",  # the OPA gate over a plan
    "activities",
    "workflows",
    "worker",
    "client",  # the typed HTTP client and the API's types
    "api",
    "cli",
)
"""The layers, bottom to top: each is a package ``stackflow.<layer>``."""


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


def _imports(module: str, source: str | None = None) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) of every import in ``module`` (its
    text, or ``source`` instead)."""
    tree = ast.parse(FILES[module].read_text() if source is None else source)
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
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


def _graph(planted: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the stackflow modules it imports (``planted``: module -> text read instead
    of its file)."""
    graph: dict[str, set[str]] = {}
    for module in FILES:
        graph[module] = set()
        for target, _, _ in _imports(module, (planted or {}).get(module)):
            while target and target not in FILES:
                target = target.rpartition(".")[0]
            # a package's own submodules importing it (``from stackflow.x import y`` inside
            # stackflow.x.z) is how a package is laid out, not a circle between modules
            if target and target != module and not module.startswith(f"{target}."):
                graph[module].add(target)
    return graph


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else -1


def _circle(graph: dict[str, set[str]]) -> str | None:
    """A circle of ``graph`` (edges to modules outside it left out), or None."""
    try:
        TopologicalSorter({m: graph[m] & graph.keys() for m in graph}).prepare()
    except CycleError as err:
        return " -> ".join(err.args[1])
    return None


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _layer(target) > _layer(module)
    )


def test_the_package_is_read_whole() -> None:
    assert {"stackflow.engine.diff", "stackflow.engine.masking", "stackflow.workflows.apply"} <= (
        FILES.keys()
    )
    assert sum(len(edges) for edges in _graph().values()) > len(FILES)


def test_every_module_lives_in_a_layer() -> None:
    assert [m for m in FILES if m != "stackflow" and _layer(m) < 0] == []


def test_the_import_graph_has_no_circles() -> None:
    assert _circle(_graph()) is None


def test_no_import_runs_up_the_layers() -> None:
    assert _upward(_graph()) == []


def test_no_module_outside_a_runtime_imports_it() -> None:
    """The built-in runtimes are plug-ins like any other: found through their entry points
    (their rules name their class by path), never imported by the rest of stackflow."""
    graph = _graph()
    runtimes = {
        m.split(".")[2]
        for m in FILES
        if m.count(".") >= 3 and _layer(m) == LAYERS.index("runtimes")
    }
    reaching = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if target.count(".") >= 2
        and target.split(".")[1] == "runtimes"
        and target.split(".")[2] in runtimes
        and not module.startswith(".".join(target.split(".")[:3]))
    )
    assert {"kubernetes", "onprem", "terraform"} <= runtimes
    assert reaching == []


def test_a_planted_back_import_is_seen_even_deferred_or_for_type_checkers() -> None:
    """The checks above fail on the imports they exist to catch: an engine module reaching
    into the CLI inside a function, a model reaching into the engine for a type only."""
    deferred = FILES["stackflow.engine.diff"].read_text() + (
        "\n\ndef _planted() -> None:\n    from stackflow.cli.app import app  # noqa\n"
    )
    before = set(_upward(_graph()))
    planted = set(_upward(_graph({"stackflow.engine.diff": deferred})))
    assert planted - before == {"stackflow.engine.diff -> stackflow.cli.app"}
    typed = FILES["stackflow.model.spec"].read_text() + (
        "\n\nif TYPE_CHECKING:\n    from stackflow.engine.spec import load_spec\n"
    )
    graph = _graph({"stackflow.model.spec": typed})
    assert "stackflow.model.spec -> stackflow.engine.spec" in _upward(graph)
    # engine.spec imports model.spec: the two are now a circle
    assert _circle({m: graph[m] for m in ("stackflow.model.spec", "stackflow.engine.spec")})


@pytest.mark.parametrize("module", sorted(FILES))
def test_no_file_is_over_600_lines(module: str) -> None:
    lines = len(FILES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{FILES[module]} has {lines} lines"


def test_no_module_imports_another_modules_private_name() -> None:
    private = [
        f"{module}:{line} imports {target}.{name}"
        for module in FILES
        for target, name, line in _imports(module)
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


def test_the_client_imports_neither_the_server_nor_the_engine() -> None:
    """``stackflow.client`` is the CLI's only transport and the server's answers' types: it
    imports the standard library and ``stackflow.core.errors`` only (the server imports it)."""
    found = {
        f"{module} imports {target}"
        for module in FILES
        if module.startswith("stackflow.client")
        for target, _, _ in _imports(module)
        if target.startswith("stackflow.")
        and not target.startswith(("stackflow.client", "stackflow.core.errors"))
    }
    assert found == set()
