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
PACKAGE_PARTS = ("model", "data", "train", "eval", "probes", "config", "analysis", "sweep", "cli", "niah")
"""Parts of src/longctx, named package-relative in docstrings (`train/sft.py`)."""
SUFFIXES = r"py|md|yaml|yml|json|jsonl|sh|sbatch|ipynb|txt|toml|j2|png|cfg"
PATH_HEADS = "|".join(sorted({*PATH_ROOTS, *PACKAGE_PARTS, "longctx", "longctx_replication"}))
PATH = re.compile(rf"(?<![\w./$~-])((?:{PATH_HEADS})/[\w./*<>{{}},-]*\.(?:{SUFFIXES}))(?![\w])")
EXEMPT = re.compile(r"[*<>{}]|NNN|^(?:runs|\.device)/|^docs/(?:real_models|replication)/gpu/")
"""Which paths are checked, by rule: a path to a file (it ends in a file suffix: a folder,
a metric name like `train/loss` or an output like `data/embedded` is not one) under one of
our top-level folders or package parts. Not checked: patterns and placeholders (`*`,
`<name>`, `{a,b}`, `step-NNNNNNN`); what a run writes or a device call carries (runs/, .device/, $OUT/...:
the lookbehind skips `$OUT/`; docs/real_models/gpu/ and docs/replication/gpu/, where the
device calls' results land once measured); other projects' paths, told apart by the
project named on the line or the two before it (`other_project`)."""
OTHER_PROJECTS = re.compile(
    r"transformers|litgpt|TinyLlama|RULER|lm-eval|lm_eval|nanochat|torchtitan|HELMET|flash.attn|STRING (?:authors|copy|repo)|"
    r"InfiniteBench's|SlimPajama|StarCoderData|FineWeb|site-packages|github|the authors'|upstream|reference code|vLLM|SkipAlign's repo|LongRecipe's repo"
)


def other_project(line: str) -> bool:
    """A line that names another project speaks of its paths, not ours (e.g. litgpt's
    `litgpt/data/prepare_slimpajama.py`, RULER's `scripts/data/synthetic/...`)."""
    return bool(OTHER_PROJECTS.search(line))


def path_exists(path: str) -> bool:
    candidates = [REPOSITORY / path, REPOSITORY / "src" / path, REPOSITORY / "src" / "longctx" / path]
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


def stale_paths(root: Path = REPOSITORY) -> list[str]:
    """`file:line: path` for each repository path in docs/*.md and src/ docstrings that does not exist."""
    texts: list[tuple[str, list[tuple[int, str]]]] = []
    for doc in [*sorted((root / "docs").glob("*.md")), root / "README.md"]:
        texts.append((str(doc.relative_to(root)), list(enumerate(doc.read_text(encoding="utf-8").splitlines(), 1))))
    for source in sorted((root / "src").rglob("*.py")):
        texts.append((str(source.relative_to(root)), docstring_lines(source)))
    stale = []
    for where, lines in texts:
        text = dict(lines)
        for number, line in lines:
            if other_project(" ".join(text.get(n, "") for n in range(number - 2, number + 1))):
                continue
            for path in PATH.findall(line):
                path = path.rstrip(".")
                if not EXEMPT.search(path) and not path_exists(path):
                    stale.append(f"{where}:{number}: {path}")
    return stale


def test_every_repository_path_in_the_docs_and_docstrings_exists():
    stale = stale_paths()
    assert not stale, "paths to files that do not exist:\n" + "\n".join(stale)


def test_the_path_reader_by_hand():
    line = "see src/longctx/batch.py, train/sft.py, `docs/design.md`, runs/x/metrics.jsonl, train/loss and tests/*.py."
    assert PATH.findall(line) == ["src/longctx/batch.py", "train/sft.py", "docs/design.md", "tests/*.py"]
    assert path_exists("src/longctx/batch.py") and path_exists("model/llama.py") and path_exists("docs/design.md")
    assert not path_exists("data/sft.py")
    assert EXEMPT.search("tests/*.py") and EXEMPT.search("runs/x") and not EXEMPT.search("docs/x.md")
    assert PATH.findall("written to $OUT/docs/x.md") == []
    assert other_project("litgpt/data/prepare_slimpajama.py") and not other_project("src/longctx/data/prepare.py")
