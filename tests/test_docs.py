"""Every `docs/X.md §N` cited in the code and the docs names a section that exists."""

import re
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"(?:docs/)?([a-z_]+)\.md,? §(\d+(?:\.\d+)*)")
SEARCHED = ("src", "tests", "benchmarks", "scripts", "analysis", "docs", "README.md", "Makefile")


def sections(markdown: str) -> set[str]:
    """Numbers of the headings `## N. Title` and `### N.M Title`."""
    return set(re.findall(r"^#+ (\d+(?:\.\d+)*)\.? ", markdown, flags=re.MULTILINE))


def citations() -> list[tuple[str, str, str]]:
    """(file:line, cited doc, section) for every citation of a doc in docs/."""
    docs = {path.stem for path in (REPOSITORY / "docs").glob("*.md")}
    found = []
    for name in SEARCHED:
        root = REPOSITORY / name
        paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.suffix in (".py", ".md", ".ipynb")]
        for path in paths:
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for doc, section in CITATION.findall(line):
                    if doc in docs:
                        found.append((f"{path.relative_to(REPOSITORY)}:{number}", doc, section))
    return found


def test_every_cited_section_exists():
    headings = {path.stem: sections(path.read_text()) for path in (REPOSITORY / "docs").glob("*.md")}
    found = citations()
    assert len(found) > 20  # the code cites docs/design.md throughout
    missing = [f"{where}: {doc}.md §{section}" for where, doc, section in found if section not in headings[doc]]
    assert not missing, "citations of sections that do not exist:\n" + "\n".join(missing)


def test_the_section_reader_by_hand():
    text = "# Title\n## 3. The batch contract\n### 7.2 Effective length\n## Notes\ntext ## 9. no\n"
    assert sections(text) == {"3", "7.2"}
    assert CITATION.findall("see docs/design.md §7.2 and design.md, §13.") == [("design", "7.2"), ("design", "13")]


PATH_ROOTS = ("src", "tests", "docs", "experiments", "sweeps", "benchmarks", "scripts", "analysis")
"""Top-level folders of this repository whose files the docs and docstrings name."""
SOURCE = REPOSITORY / "src"
PACKAGES = sorted(init.parent for init in SOURCE.rglob("__init__.py"))
"""Every package under src/ (longctx, longctx/eval/niah, longctx_replication, ...)."""
PACKAGE_PARTS = tuple(sorted({package.name for package in PACKAGES} - {"longctx", "longctx_replication"}))
"""Parts of src/longctx, named package-relative in docstrings (`train/sft.py`, `niah/needles.py`),
read from the tree so that a rename cannot leave a stale one here."""
SUFFIXES = r"py|md|yaml|yml|json|jsonl|sh|sbatch|ipynb|txt|toml|j2|png|cfg"
PATH_HEADS = "|".join(sorted({*PATH_ROOTS, *PACKAGE_PARTS, "longctx", "longctx_replication"}))
PATH = re.compile(rf"(?<![\w./$~-])((?:{PATH_HEADS})/[\w./*<>{{}},-]*\.(?:{SUFFIXES}))(?![\w])")
EXEMPT = re.compile(r"[*<>{}]|NNN|/X\.|^(?:runs|\.device)/|^docs/(?:real_models|replication)/gpu/")
"""Which paths are checked, by rule: a path to a file (it ends in a file suffix: a folder,
a metric name like `train/loss` or an output like `data/embedded` is not one) under one of
our top-level folders or package parts. Not checked: patterns and placeholders (`*`,
`<name>`, `{a,b}`, `step-NNNNNNN`, `sweeps/X.yaml`); what a run writes or a device call carries (runs/, .device/, $OUT/...:
the lookbehind skips `$OUT/`; docs/real_models/gpu/ and docs/replication/gpu/, where the
device calls' results land once measured); other projects' paths, told apart by the
project named on the line or the two before it (`other_project`)."""
OTHER_PROJECTS = re.compile(
    r"transformers|litgpt|TinyLlama|RULER|lm-eval|lm_eval|nanochat|torchtitan|HELMET|flash.attn|STRING (?:authors|copy|repo)|"
    r"InfiniteBench's|SlimPajama|StarCoderData|FineWeb|site-packages|github|the authors'|upstream|reference code|vLLM|SkipAlign's repo|LongRecipe's repo|wandb/sweeps"
)


def other_project(line: str) -> bool:
    """A line that names another project speaks of its paths, not ours (e.g. litgpt's
    `litgpt/data/prepare_slimpajama.py`, RULER's `scripts/data/synthetic/...`)."""
    return bool(OTHER_PROJECTS.search(line))


def path_exists(path: str) -> bool:
    """From the repository root, from src/, src/longctx/ or experiments/ (the configs name each
    other so: `sft/tiny_normal.yaml`), or from any package named by the path's first part
    (`niah/needles.py` is src/longctx/eval/niah/needles.py)."""
    head = path.split("/")[0]
    candidates = [REPOSITORY / path, SOURCE / path, SOURCE / "longctx" / path, REPOSITORY / "experiments" / path]
    candidates += [package.parent / path for package in PACKAGES if package.name == head]
    return any(candidate.exists() for candidate in candidates)


def docstring_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line inside a docstring or comment of a Python file."""
    import ast

    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found += [(n, lines[n - 1]) for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)]
    found += [(n, line) for n, line in enumerate(lines, 1) if line.lstrip().startswith("#")]
    return found


def prose(root: Path = REPOSITORY) -> list[tuple[str, list[tuple[int, str]]]]:
    """(file, [(line number, text)]) of what the repository says in words: docs/*.md, the
    READMEs, the docstrings and comments of every Python file of ours (src/, tests/,
    benchmarks/, scripts/, experiments/), and the experiment and sweep configs (YAML,
    templates and sbatch, whole: their values name files too)."""
    texts: list[tuple[str, list[tuple[int, str]]]] = []
    documents = [*sorted((root / "docs").glob("*.md")), root / "README.md", *sorted((root / "src").rglob("*.md"))]
    configs = sorted(
        path
        for folder in ("experiments", "sweeps")
        for path in (root / folder).rglob("*")
        if path.suffix in (".yaml", ".yml", ".j2", ".sbatch")
    )
    for path in [*documents, *configs]:
        texts.append((str(path.relative_to(root)), list(enumerate(path.read_text(encoding="utf-8").splitlines(), 1))))
    for folder in ("src", "tests", "benchmarks", "scripts", "experiments"):
        for source in sorted((root / folder).rglob("*.py")):
            texts.append((str(source.relative_to(root)), docstring_lines(source)))
    return texts


def stale_paths(root: Path = REPOSITORY) -> list[str]:
    """`file:line: path` for each repository path in the repository's prose (`prose`) that does not exist."""
    stale = []
    for where, lines in prose(root):
        text = dict(lines)
        for number, line in lines:
            if other_project(" ".join(text.get(n, "") for n in range(number - 2, number + 1))):
                continue
            for path in PATH.findall(line):
                path = path.rstrip(".")
                if not EXEMPT.search(path) and not path_exists(path):
                    stale.append(f"{where}:{number}: {path}")
    return stale


MODULE_FILE = re.compile(r"(?<![\w./$~-])(\w+\.py)(?![\w])")
"""A bare module file (`runs.py`), as a package's docstring names its own modules."""


def stale_package_modules(root: Path = REPOSITORY) -> list[str]:
    """`file:line: name.py` for each bare module file a package's docstring names that is in
    neither the package nor a package above it (cli/__init__.py's `common.py` is
    cli/common.py, its `runtime.py` is longctx/runtime.py)."""
    stale = []
    for init in sorted((root / "src").rglob("__init__.py")):
        lines = docstring_lines(init)
        text = dict(lines)
        for number, line in lines:
            if other_project(" ".join(text.get(n, "") for n in range(number - 2, number + 1))):
                continue
            for name in MODULE_FILE.findall(line):
                if not any((folder / name).exists() for folder in init.parents if folder.is_relative_to(root / "src")):
                    stale.append(f"{init.relative_to(root)}:{number}: {name}")
    return stale


def test_every_module_a_package_docstring_names_exists():
    stale = stale_package_modules()
    assert not stale, "modules named in package docstrings that are not there:\n" + "\n".join(stale)


def test_the_package_module_reader_by_hand():
    assert MODULE_FILE.findall("runs.py (history), fi.py, eval/task.py, `generation.py`; a.pyc") == [
        "runs.py",
        "fi.py",
        "generation.py",
    ]


MODULE_NAME = re.compile(r"(?<![\w.$/-])(longctx(?:_replication)?(?:\.[A-Za-z_]\w*)+)")
"""A dotted name under one of our packages: `longctx.eval.niah.evaluation`, `longctx.config.NiahConfig`."""
NOT_MODULES = {"longctx.position_methods"}
"""Dotted names of ours that are no module: the plugins' entry-point group."""


def top_level_names(module: Path) -> dict[str, object]:
    """The names a module binds at its top level (definitions, assignments, imports, also
    inside top-level `if`/`try`), each to its node: a class's node lets its attributes be checked."""
    import ast

    names: dict[str, object] = {}

    def bind(body: list) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    names[(alias.asname or alias.name).split(".")[0]] = node
            elif isinstance(node, (ast.If, ast.Try)):
                bind(node.body)
                bind(node.orelse)
                for handler in getattr(node, "handlers", []):
                    bind(handler.body)
                bind(getattr(node, "finalbody", []))

    bind(ast.parse(module.read_text(encoding="utf-8")).body)
    return names


def module_name_exists(name: str, source: Path = SOURCE) -> bool:
    """Whether `name` is one of our modules, or a name a module binds (and, for a class,
    one of its attributes), read from the files under src/ without importing anything."""
    import ast

    parts = name.split(".")
    folder = source / parts[0]
    if not (folder / "__init__.py").exists():
        return False
    rest = parts[1:]
    while rest and (folder / rest[0] / "__init__.py").exists():
        folder, rest = folder / rest[0], rest[1:]
    if rest and (folder / f"{rest[0]}.py").exists():
        module, rest = folder / f"{rest[0]}.py", rest[1:]
    else:
        module = folder / "__init__.py"
    if not rest:
        return True
    node = top_level_names(module).get(rest[0])
    if node is None:
        return False
    if len(rest) == 1 or not isinstance(node, ast.ClassDef):
        return True  # an attribute of a function's result or of an imported object is not followed
    attributes = set()
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            attributes.add(statement.name)
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            attributes.add(statement.target.id)
        elif isinstance(statement, ast.Assign):
            attributes |= {target.id for target in statement.targets if isinstance(target, ast.Name)}
    return rest[1] in attributes or any(not isinstance(base, ast.Name) or base.id != "object" for base in node.bases)


def stale_module_names(root: Path = REPOSITORY) -> list[str]:
    """`file:line: name` for each dotted name of ours in the repository's prose that names no module or attribute."""
    stale = []
    for where, lines in prose(root):
        for number, line in lines:
            for name in MODULE_NAME.findall(line):
                if name not in NOT_MODULES and not module_name_exists(name, root / "src"):
                    stale.append(f"{where}:{number}: {name}")
    return stale


def test_every_module_name_in_the_docs_and_docstrings_exists():
    stale = stale_module_names()
    assert not stale, "module names that name nothing:\n" + "\n".join(stale)


def test_the_module_name_reader_by_hand():
    line = (
        "`longctx.eval.niah.evaluation`, longctx.config.NiahConfig, python -m longctx_replication.report; longctx.yaml"
    )
    assert MODULE_NAME.findall(line) == [
        "longctx.eval.niah.evaluation",
        "longctx.config.NiahConfig",
        "longctx_replication.report",
        "longctx.yaml",
    ]
    assert MODULE_NAME.findall("src/longctx.egg-info and $longctx.x") == []
    assert module_name_exists("longctx") and module_name_exists("longctx.eval.niah.evaluation")
    assert module_name_exists("longctx.config.NiahConfig")  # re-exported by the package
    assert module_name_exists("longctx.config.eval.NiahConfig.task")  # a field of the dataclass
    assert module_name_exists("longctx.config.model.ModelConfig.from_preset")
    assert module_name_exists("longctx_replication.twin_plan")
    assert not module_name_exists("longctx.eval.effective_length_effective_length")
    assert not module_name_exists("longctx.config.eval.NiahConfig.no_such_field")
    assert not module_name_exists("longctx.analysis.replication_report")
    assert not module_name_exists("longctx.yaml")


def test_every_repository_path_in_the_docs_and_docstrings_exists():
    stale = stale_paths()
    assert not stale, "paths to files that do not exist:\n" + "\n".join(stale)


def test_the_path_reader_by_hand():
    line = "see src/longctx/batch.py, train/sft.py, `docs/design.md`, runs/x/metrics.jsonl, train/loss and tests/*.py."
    assert PATH.findall(line) == ["src/longctx/batch.py", "train/sft.py", "docs/design.md", "tests/*.py"]
    assert path_exists("src/longctx/batch.py") and path_exists("model/llama.py") and path_exists("docs/design.md")
    assert not path_exists("data/sft.py")
    assert path_exists("niah/needles.py") and path_exists("position_methods/method.py")
    assert not path_exists("position_methods/config.py") and not path_exists("niah/task.py")
    assert "niah" in PACKAGE_PARTS and "position_methods" in PACKAGE_PARTS and "longctx" not in PACKAGE_PARTS
    assert EXEMPT.search("tests/*.py") and EXEMPT.search("runs/x") and not EXEMPT.search("docs/x.md")
    assert PATH.findall("written to $OUT/docs/x.md") == []
    assert other_project("litgpt/data/prepare_slimpajama.py") and not other_project("src/longctx/data/prepare.py")
