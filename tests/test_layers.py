"""The package's import structure: layers import downwards only, and no module imports
itself back through a chain (an import circle). Read from the source with `ast`, so an
import inside a function or under TYPE_CHECKING counts too."""

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[1] / "src" / "longctx"

LAYERS = {
    "errors": 0,
    "batch": 0,
    "runtime": 0,
    "wandb_mode": 0,
    "model": 1,
    "config": 1,
    "data": 1,
    "probes": 2,
    "niah": 2,
    "train": 3,
    "analysis": 4,
    "replication": 4,
    "sweep": 4,
    "cli": 5,
    "__main__": 5,
}
"""Higher numbers may import lower ones, never the reverse: model, data and the config
schemas never reach up into probes, niah or train; only the CLI sees everything. Peers
may import each other as long as no circle forms (test_no_import_circle)."""


def module_name(path: Path, root: Path = SOURCE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str], root: Path = SOURCE) -> set[str]:
    """The longctx modules `path` imports (the longest known prefix of each name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("longctx.") and name != module_name(path, root):
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in SOURCE.rglob("*.py")}
    known = set(paths)
    return {name: imported_modules(path, known) - {"longctx"} for name, path in paths.items()}


def layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else module
    if top not in LAYERS:
        pytest.fail(f"{module}: unknown top-level part {top!r}; give it a layer in LAYERS")
    return LAYERS[top]


def test_layers_import_downwards_only():
    upward = [
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if module != "longctx"
        for target in targets
        if layer(target) > layer(module)
    ]
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(sorted(upward))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = 2
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_llama_does_not_import_the_position_methods():
    """llama.py defines the positions-provider interface; the methods implement it."""
    assert not {
        name for name in import_graph()["longctx.model.llama"] if name.startswith("longctx.model.position_methods")
    }


def test_the_checker_sees_a_planted_circle(tmp_path):
    """The graph reader finds imports inside functions and TYPE_CHECKING blocks."""
    package = tmp_path / "longctx"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "__init__.py").write_text("")
    (package / "model" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from longctx.model.b import B\n"
    )
    (package / "model" / "b.py").write_text("def f():\n    from longctx.model import a\n")
    known = {module_name(p, package) for p in package.rglob("*.py")}
    graph = {module_name(p, package): imported_modules(p, known, package) for p in package.rglob("*.py")}
    assert graph["longctx.model.a"] == {"longctx.model.b"} and "longctx.model.a" in graph["longctx.model.b"]
    assert find_cycle(graph) in (
        ["longctx.model.a", "longctx.model.b", "longctx.model.a"],
        ["longctx.model.b", "longctx.model.a", "longctx.model.b"],
    )
