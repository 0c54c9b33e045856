"""Verdicts of the miniature replication (docs/replication.md, docs/design.md §13).

Each STRING / SkipAlign finding becomes a `Finding`: the measured numbers, a verdict
(holds | does not hold | inconclusive) and the reason. The rules are fixed before any run
(so a finding that does not hold is a result, not a prompt to tune) and use Wilson 95%
intervals on pass rates:

- `effective_length_grows` (STRING Finding 1 / Fig. 2a): effective lengths of >= 3
  windows trained on equal tokens. Holds when they are non-decreasing in the window and
  the largest window's exceeds the smallest's; inconclusive when no model passes at any
  length (a model that does not retrieve has effective length 0 for a reason unrelated to
  f(i)).
- `f_at_effective_length_aligns` (Finding 2 / Fig. 2b): f(effective length) of each
  window's run. Holds when max/min of those f values is <= `F_RATIO_TOLERANCE` (the
  paper's claim is qualitative: the points line up); inconclusive when an effective
  length is 0 (f(0) is just the token count).
- `failures_far_from_question` (Fig. 4): recall of needles in the first half of the
  haystack (far from the question) vs the second half. Holds when the far recall's Wilson
  interval lies wholly below the near one's; inconclusive when overall recall is 0 or 1.
- `effective_below_window` (headline): largest window's effective length < the window.
  Holds when the pass rate at the window is below the threshold while some shorter
  length passes; inconclusive when no length passes.
- `string_beats_rope` (Table 1): pass rate at the training window, StRing vs RoPE.
  Holds when StRing's Wilson interval lies wholly above RoPE's; does not hold when
  RoPE's lies wholly above or both intervals overlap with retrieval present;
  inconclusive when both rates are 0.
- `skipalign_beyond_window` (SkipAlign Fig. 3): effective length after SkipAlign SFT vs
  Normal SFT. Holds when SkipAlign's is larger and exceeds the SFT window; inconclusive
  when neither model passes at any length.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from longctx.niah.search import wilson_interval

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
F_RATIO_TOLERANCE = 2.0
"""Finding 2 holds when f(effective length) differs by at most this factor across windows."""


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


@dataclass(frozen=True)
class LengthPass:
    """One tested length of an effective-length search."""

    length: int
    passed: int
    tests: int

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.passed, self.tests)


def _any_pass(rows: Sequence[LengthPass]) -> bool:
    return any(row.passed for row in rows)


def effective_length_grows(effective: Mapping[int, int], rows: Mapping[int, Sequence[LengthPass]]) -> Finding:
    """Finding 1: {window: effective length} at equal training tokens."""
    title = "Finding 1 / Fig. 2a: at equal tokens, a larger window gives a longer effective length"
    windows = sorted(effective)
    numbers = {
        "windows": windows,
        "effective_length": [effective[w] for w in windows],
        "passed_tests": [sum(r.passed for r in rows[w]) for w in windows],
        "tests": [sum(r.tests for r in rows[w]) for w in windows],
    }
    if len(windows) < 3:
        return Finding("effective_length_grows", title, INCONCLUSIVE, f"needs >= 3 windows, got {windows}", numbers)
    if not any(_any_pass(rows[w]) for w in windows):
        tests = sum(numbers["tests"])
        return Finding(
            "effective_length_grows",
            title,
            INCONCLUSIVE,
            f"no model passes any NIAH test (0/{tests}; Wilson upper bound per length "
            f"{max(r.interval[1] for w in windows for r in rows[w]):.2f}): they do not retrieve, "
            "so effective length 0 says nothing about f(i)",
            numbers,
        )
    values = [effective[w] for w in windows]
    grows = all(a <= b for a, b in itertools.pairwise(values)) and values[-1] > values[0]
    why = "effective lengths " + ", ".join(f"L={w}: {effective[w]}" for w in windows)
    return Finding("effective_length_grows", title, HOLDS if grows else FAILS, why, numbers)


def f_at_effective_length_aligns(f_values: Mapping[int, float], effective: Mapping[int, int]) -> Finding:
    """Finding 2: {window: f(effective length)} of each window's run."""
    title = "Finding 2 / Fig. 2b: effective length is set by f(effective length), across windows"
    windows = sorted(f_values)
    numbers = {
        "windows": windows,
        "effective_length": [effective[w] for w in windows],
        "f_at_effective_length": [f_values[w] for w in windows],
        "tolerance": F_RATIO_TOLERANCE,
    }
    if len(windows) < 2 or any(effective[w] == 0 for w in windows):
        return Finding(
            "f_at_effective_length_aligns",
            title,
            INCONCLUSIVE,
            "an effective length is 0 (f(0) counts every token, not a learned distance) or fewer than 2 windows",
            numbers,
        )
    low, high = min(f_values.values()), max(f_values.values())
    ratio = math.inf if low <= 0 else high / low
    numbers["ratio"] = ratio
    verdict = HOLDS if ratio <= F_RATIO_TOLERANCE else FAILS
    return Finding(
        "f_at_effective_length_aligns",
        title,
        verdict,
        f"f(effective length) spans a factor {ratio:.2f} across windows (holds when <= {F_RATIO_TOLERANCE})",
        numbers,
    )


def failures_far_from_question(far: tuple[int, int], near: tuple[int, int]) -> Finding:
    """Fig. 4: (found, needles) far from the question (first half of the haystack) and near it."""
    title = "Fig. 4: failures concentrate where the needle is far from the question"
    far_interval, near_interval = wilson_interval(*far), wilson_interval(*near)
    numbers = {
        "far_found": far[0],
        "far_needles": far[1],
        "far_interval": far_interval,
        "near_found": near[0],
        "near_needles": near[1],
        "near_interval": near_interval,
    }
    found, total = far[0] + near[0], far[1] + near[1]
    if total == 0 or found in (0, total):
        return Finding(
            "failures_far_from_question",
            title,
            INCONCLUSIVE,
            f"recall is {found}/{total}: nothing varies with distance",
            numbers,
        )
    far_rate, near_rate = far[0] / far[1], near[0] / near[1]
    why = (
        f"recall far {far_rate:.2f} [{far_interval[0]:.2f}, {far_interval[1]:.2f}] vs near {near_rate:.2f} "
        f"[{near_interval[0]:.2f}, {near_interval[1]:.2f}]"
    )
    if far_interval[1] < near_interval[0]:
        return Finding("failures_far_from_question", title, HOLDS, why, numbers)
    if far_interval[0] > near_interval[1]:
        return Finding("failures_far_from_question", title, FAILS, why, numbers)
    return Finding("failures_far_from_question", title, INCONCLUSIVE, why + ": the intervals overlap", numbers)


def effective_below_window(window: int, effective: int, rows: Sequence[LengthPass], threshold: float) -> Finding:
    """Headline: the largest window's effective length is below the window."""
    title = "Headline: effective length < training window (largest window)"
    at_window = [r for r in rows if r.length == window]
    numbers = {
        "window": window,
        "effective_length": effective,
        "threshold": threshold,
        "pass_at_window": [at_window[0].passed, at_window[0].tests] if at_window else None,
    }
    if not _any_pass(rows) or effective == 0:
        return Finding(
            "effective_below_window",
            title,
            INCONCLUSIVE,
            "no length passes: effective length 0 < window is trivial for a model that does not retrieve",
            numbers,
        )
    if effective < window:
        return Finding(
            "effective_below_window", title, HOLDS, f"effective length {effective} < window {window}", numbers
        )
    return Finding(
        "effective_below_window", title, FAILS, f"effective length {effective} reaches the window {window}", numbers
    )


def string_beats_rope(rope: tuple[int, int], string: tuple[int, int], window: int) -> Finding:
    """Table 1: (passed, tests) at the training window for RoPE and StRing."""
    title = "Table 1: StRing beats RoPE at the training window"
    rope_interval, string_interval = wilson_interval(*rope), wilson_interval(*string)
    numbers = {
        "window": window,
        "rope": list(rope),
        "rope_interval": rope_interval,
        "string": list(string),
        "string_interval": string_interval,
    }
    why = (
        f"pass at L={window}: RoPE {rope[0]}/{rope[1]} [{rope_interval[0]:.2f}, {rope_interval[1]:.2f}], "
        f"StRing {string[0]}/{string[1]} [{string_interval[0]:.2f}, {string_interval[1]:.2f}]"
    )
    if rope[0] == 0 and string[0] == 0:
        return Finding("string_beats_rope", title, INCONCLUSIVE, why + ": neither retrieves", numbers)
    if string_interval[0] > rope_interval[1]:
        return Finding("string_beats_rope", title, HOLDS, why, numbers)
    return Finding("string_beats_rope", title, FAILS, why, numbers)


def skipalign_beyond_window(
    normal: int, skipalign: int, window: int, normal_rows: Sequence[LengthPass], skipalign_rows: Sequence[LengthPass]
) -> Finding:
    """SkipAlign Fig. 3: effective lengths after Normal SFT and SkipAlign SFT."""
    title = "SkipAlign Fig. 3: SkipAlign SFT extends NIAH beyond the SFT window, Normal SFT does not"
    numbers = {"window": window, "normal_effective_length": normal, "skipalign_effective_length": skipalign}
    if not (_any_pass(normal_rows) or _any_pass(skipalign_rows)):
        return Finding(
            "skipalign_beyond_window",
            title,
            INCONCLUSIVE,
            "neither SFT model passes any NIAH test, within the SFT window or beyond it",
            numbers,
        )
    holds = skipalign > normal and skipalign > window
    return Finding(
        "skipalign_beyond_window",
        title,
        HOLDS if holds else FAILS,
        f"effective length Normal {normal}, SkipAlign {skipalign}, SFT window {window}",
        numbers,
    )


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
