"""Every `docs/X.md §N` cited in the code and the docs names a section that exists."""

import re
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"(?:docs/)?([a-z_]+)\.md,? §(\d+(?:\.\d+)*)")
SEARCHED = ("src", "tests", "benchmarks", "analysis", "docs", "README.md", "Makefile")


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
