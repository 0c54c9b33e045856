"""The library apart from the lab: no module of src/longctx or src/longctx_replication imports
a tool of tools/ (tools/README.md), whether as the `tools` package or by a tool script's own
name (the tools are script folders whose modules import each other by bare names), and every
tool folder says what it is for. Read from the source with `ast`, so an import inside a
function or under TYPE_CHECKING counts too."""

import ast
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
TOOLS = REPOSITORY / "tools"
RESEARCH = (REPOSITORY / "src" / "longctx", REPOSITORY / "src" / "longctx_replication")


def tool_names(tools: Path = TOOLS) -> set[str]:
    """`tools` and the module name of every script under it."""
    return {tools.name} | {path.stem for path in tools.rglob("*.py")}


def tool_imports(roots: tuple[Path, ...], names: set[str]) -> list[str]:
    """`file -> module` for every import in `roots` whose first name is a tool's."""
    bad = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    modules = [node.module]
                else:
                    continue
                bad += [f"{path.relative_to(root.parent)} -> {m}" for m in modules if m.split(".")[0] in names]
    return sorted(bad)


def test_the_research_code_imports_no_tool():
    names = tool_names()
    assert {"gpu_next", "staging", "gguf_parts", "gpu_twin", "lease", "lender"} <= names
    bad = tool_imports(RESEARCH, names)
    assert not bad, "the library or the campaign imports the lab's tools:\n" + "\n".join(bad)


def test_the_checker_sees_a_planted_tool_import(tmp_path):
    tools = tmp_path / "tools"
    (tools / "twin").mkdir(parents=True)
    (tools / "twin" / "lease.py").write_text("")
    package = tmp_path / "src" / "longctx_replication"
    package.mkdir(parents=True)
    (package / "a.py").write_text("def f():\n    from lease import cut_in_force\n")
    (package / "b.py").write_text("import tools.twin.lease\nimport json\n")
    names = tool_names(tools)
    assert tool_imports((package,), names) == [
        "longctx_replication/a.py -> lease",
        "longctx_replication/b.py -> tools.twin.lease",
    ]


def test_the_tools_readme_names_every_tool_folder_and_script():
    readme = (TOOLS / "README.md").read_text()
    for path in sorted(TOOLS.rglob("*.py")):
        relative = str(path.relative_to(REPOSITORY))
        assert relative in readme or str(path.relative_to(TOOLS)) in readme, f"tools/README.md does not name {relative}"
