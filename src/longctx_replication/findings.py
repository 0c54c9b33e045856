"""Findings of the miniature replication (docs/replication.md, docs/design.md §13).

Each STRING / SkipAlign finding becomes a `Finding`: the measured numbers, a verdict
(holds | does not hold | inconclusive) and the reason, stored in a summary JSON and shown
as a Markdown table. The rules that produce them, with the seed as the unit, are in
longctx_replication/seed_verdicts.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"


@dataclass
class Finding:
    key: str
    """Short identifier (the summary JSON's key)."""
    title: str
    """The paper's claim, with its figure/table."""
    verdict: str
    """holds | does not hold | inconclusive."""
    why: str
    """The numbers the verdict rests on, in words."""
    numbers: dict = field(default_factory=dict)
    """The measured values (effective lengths, pass rates with Wilson intervals)."""


def write_summary(findings: Sequence[Finding], path: str | Path, meta: Mapping | None = None) -> Path:
    """The findings table as JSON: {meta, findings: {key: {title, verdict, why, numbers}}}."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "meta": dict(meta or {}),
        "findings": {f.key: {k: v for k, v in asdict(f).items() if k != "key"} for f in findings},
    }
    path.write_text(json.dumps(body, indent=2, default=float) + "\n")
    return path


def findings_markdown(findings: Sequence[Finding]) -> str:
    """The findings table (Markdown)."""
    lines = ["| finding | verdict | why |", "|---|---|---|"]
    lines += [f"| {f.title} | **{f.verdict}** | {f.why} |" for f in findings]
    return "\n".join(lines)


def checkout_commit(directory: Path) -> str:
    """The commit the runs' code came from: long runs start from a pinned checkout, and
    every summary records which. `git rev-parse HEAD` in `directory`, with "+dirty" when
    tracked files differ; where the tree travelled without its .git (the GPU machine:
    docs/replication.md, "The GPU twin") the caller names it in LONGCTX_COMMIT."""
    if os.environ.get("LONGCTX_COMMIT"):
        return os.environ["LONGCTX_COMMIT"]

    def git(*args: str) -> str:
        try:
            found = subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True)
        except OSError:  # no git installed
            return ""
        return found.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if not commit:
        return "unknown (not a git checkout: set LONGCTX_COMMIT)"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
