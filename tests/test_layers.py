"""The package's import structure: layers import downwards only (and sideways only along
the allowed peer imports), no module imports itself back through a chain (an import
circle), and no source file is over the line limit. Read from the source with `ast`, so an
import inside a function or under TYPE_CHECKING counts too."""

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[1] / "src" / "longctx"

LAYERS = {
    "errors": 0,
    "config": 1,
    "batch": 2,
    "model": 2,
    "data": 2,
    "runtime": 2,
    "wandb_setup": 2,
    "model_tokenizer": 3,
    "hf_attention": 3,
    "probes": 3,
    "eval": 3,
    "train": 4,
    "analysis": 5,
    "sweep": 5,
    "gpu_checks": 5,
    "gpu_design_checks": 5,
    "cli": 6,
    "__main__": 6,
}
"""The house, bottom to top: errors < config < batch, model, data (+ the process and W&B
setup) < model_tokenizer (which reads model files and tokenizers), hf_attention (the
position methods inside transformers models), probes, eval (the
evaluation engine and every benchmark on it, the effective-length search among them) <
train (whose in-training probe and NIAH after SFT read eval) < analysis, sweep, gpu_checks
< cli; gpu_checks and gpu_design_checks (the GPU path's numerical checks that the `gpu` tests and `make
gpu-check` share: it drives the model, a training step and a pretrain) sits beside
analysis and sweep. eval reads a checkpoint's own tokenizer through model_tokenizer (the
lm-eval adapter), its one peer edge. A module imports
from lower layers, and from its own layer only along PEER_IMPORTS: model and data never
import each other, so data never needs a model (docs/design.md, "House rules")."""

PEER_IMPORTS = {
    ("model", "batch"),
    ("data", "batch"),
    ("eval", "model_tokenizer"),
    ("__main__", "cli"),
}
"""(importer, imported) pairs of top-level parts allowed inside one layer; parts import
themselves freely (as long as no circle forms)."""
PEER_MODULE_IMPORTS = {
    ("longctx.model.hf", "longctx.data.tokenizer"): "the HF export writes the run's tokenizer beside the weights",
}
"""Single module pairs allowed between parts of one layer that PEER_IMPORTS keeps apart."""

MAX_LINES = 500
"""No source file is longer: a longer one holds more than one concern."""


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


def top_part(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def layer(module: str) -> int:
    top = top_part(module)
    if top not in LAYERS:
        pytest.fail(f"{module}: unknown top-level part {top!r}; give it a layer in LAYERS")
    return LAYERS[top]


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up a layer, or sideways between parts not in PEER_IMPORTS."""
    bad = []
    for module, targets in graph.items():
        if module == "longctx":
            continue
        for target in targets:
            source_part, target_part = top_part(module), top_part(target)
            upward = layer(target) > layer(module)
            sideways = (
                layer(target) == layer(module)
                and source_part != target_part
                and (source_part, target_part) not in PEER_IMPORTS
                and (module, target) not in PEER_MODULE_IMPORTS
            )
            if upward or sideways:
                bad.append(f"{module} -> {target}")
    return sorted(bad)


def test_every_module_has_a_layer():
    for module in import_graph():
        if module != "longctx":
            layer(module)


def test_layers_import_downwards_only():
    bad = crossings(import_graph())
    assert not bad, "imports up a layer or between peers of one layer:\n" + "\n".join(bad)


def test_the_config_imports_nothing_of_longctx_but_errors():
    graph = import_graph()
    outside = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if top_part(module) == "config"
        for target in targets
        if top_part(target) not in ("config", "errors")
    }
    assert not outside


def test_the_checker_refuses_a_data_module_that_imports_the_model():
    graph = {"longctx.data.x": {"longctx.model.llama"}, "longctx.model.llama": {"longctx.batch"}}
    assert crossings(graph) == ["longctx.data.x -> longctx.model.llama"]
    assert crossings({"longctx.config.model": {"longctx.batch"}}) == ["longctx.config.model -> longctx.batch"]


def test_no_source_file_is_over_the_line_limit():
    long = {
        str(path.relative_to(SOURCE.parent)): count
        for path in SOURCE.rglob("*.py")
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"source files over {MAX_LINES} lines: {long}"


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


@pytest.mark.parametrize("module", ["longctx.model.llama", "longctx.model.layer_attention"])
def test_the_attention_path_does_not_import_the_position_methods(module):
    """layer_attention.py defines the positions-provider interface; the methods implement it."""
    assert not {name for name in import_graph()[module] if name.startswith("longctx.model.position_methods")}


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


OPTIONAL_PACKAGE_IMPORTERS = {
    "lm_eval": {"longctx.eval.lm_eval", "longctx.cli.harness_commands"},
    "transformers": {
        "longctx.hf_attention",
        "longctx.hf_attention.kernel",
        "longctx.hf_attention.methods",
        "longctx.gpu_checks",  # the hf attention check, imported inside its function
        "longctx.model.gguf",  # convert-gguf: transformers' GGUF reader, imported inside its function
        "longctx.eval.helmet.citations",  # HELMET's ALCE NLI model, loaded by path inside load_nli
        "longctx.eval.helmet.judge",  # the local judge model, loaded by path inside load_judge
    },
}
"""Packages of an extra (`longctx[lm-eval]`, `longctx[hf]`) and the only modules that may
import them, so the rest of the suite runs without the extra installed."""


def importers_of(package: str) -> set[str]:
    found = set()
    for path in SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(name == package or name.startswith(f"{package}.") for name in names):
                found.add(module_name(path))
    return found


@pytest.mark.parametrize("package", sorted(OPTIONAL_PACKAGE_IMPORTERS))
def test_an_extras_package_is_imported_only_by_its_adapter(package):
    assert importers_of(package) <= OPTIONAL_PACKAGE_IMPORTERS[package]
    assert importers_of(package), f"no module imports {package}: drop it from OPTIONAL_PACKAGE_IMPORTERS"


CAMPAIGN = SOURCE.parent / "longctx_replication"
"""Our own replication campaign: it imports the library; the library never imports it."""


def campaign_imports(root: Path = SOURCE) -> list[str]:
    """`module -> name` for every import of longctx_replication inside the library."""
    bad = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            bad += [f"{module_name(path, root)} -> {name}" for name in names if name.split(".")[0] == CAMPAIGN.name]
    return sorted(bad)


def test_the_library_never_imports_the_campaign():
    assert CAMPAIGN.is_dir()
    bad = campaign_imports()
    assert not bad, "the library imports the replication campaign:\n" + "\n".join(bad)


def test_the_campaign_checker_sees_a_planted_import(tmp_path):
    package = tmp_path / "longctx"
    (package / "eval").mkdir(parents=True)
    (package / "eval" / "x.py").write_text("def f():\n    from longctx_replication.findings import Finding\n")
    assert campaign_imports(package) == ["longctx.eval.x -> longctx_replication.findings"]


def test_campaign_modules_stay_under_the_line_limit():
    long = [path.name for path in CAMPAIGN.rglob("*.py") if len(path.read_text().splitlines()) > MAX_LINES]
    assert not long
