"""Findings of the miniature replication (docs/replication.md, docs/design.md §13).

Each STRING / SkipAlign finding becomes a `Finding`: the measured numbers, a verdict
(holds | does not hold | inconclusive) and the reason, stored in a summary JSON and shown
as a Markdown table. The rules that produce them, with the seed as the unit, are in
longctx/analysis/seed_verdicts.py; `wilson` gives the per-length NIAH intervals.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"


def wilson(passed: int, tests: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for `passed` successes in `tests` trials (0/0 -> (0, 1))."""
    if tests <= 0:
        return 0.0, 1.0
    p = passed / tests
    denominator = 1 + z * z / tests
    centre = (p + z * z / (2 * tests)) / denominator
    half = z * math.sqrt(p * (1 - p) / tests + z * z / (4 * tests * tests)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


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


def read_verdicts(path: str | Path) -> dict[str, str]:
    """{finding key: verdict} of a summary JSON."""
    return {key: value["verdict"] for key, value in json.loads(Path(path).read_text())["findings"].items()}


def findings_markdown(findings: Sequence[Finding]) -> str:
    """The findings table (Markdown)."""
    lines = ["| finding | verdict | why |", "|---|---|---|"]
    lines += [f"| {f.title} | **{f.verdict}** | {f.why} |" for f in findings]
    return "\n".join(lines)
