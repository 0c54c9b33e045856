"""The model layer's imports form no circle: llama.py defines the positions-provider
interface and never imports the position methods, which import it (read with `ast`, so
function-level imports count too)."""

import ast
from pathlib import Path

import longctx

SOURCE = Path(longctx.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """longctx modules `path` imports, anywhere in the file (`from pkg import module` included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name in known}


def model_graph() -> dict[str, set[str]]:
    paths = sorted((SOURCE / "model").rglob("*.py"))
    known = {module_name(path) for path in paths}
    return {module_name(path): imports(path, known) - {module_name(path)} for path in paths}


def test_llama_does_not_import_the_position_methods():
    graph = model_graph()
    assert not {name for name in graph["longctx.model.llama"] if name.startswith("longctx.model.position_methods")}


def test_model_modules_import_no_circle():
    graph = model_graph()

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for name in graph.get(start, ()):
            if name == target or (name not in seen and reaches(name, target, seen | {name})):
                return True
        return False

    packages = {"longctx.model.position_methods"}  # a package's __init__ re-exports its modules
    circles = [name for name in graph if name not in packages and reaches(name, name, {name})]
    assert not circles, circles
