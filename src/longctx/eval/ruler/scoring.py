"""RULER's scoring (NVIDIA/RULER scripts/eval/evaluate.py and eval/synthetic/constants.py).

A prediction is post-processed as RULER does: stripped, every control character
[\\x00-\\x1f] replaced by a newline, stripped again. Then, per sample with references r_1..r_m
(case-insensitive substring tests):

    string_match_all  = (1/m) sum_j [r_j in pred]     (niah, vt, cwe, fwe)
    string_match_part = max_j [r_j in pred]           (qa)

and a task's score is 100 x the mean over samples, rounded to 2 decimals. A length's score
is the mean over tasks; RULER's effective length is the largest tested length whose score
exceeds 85.6. Its Avg. and wAvg. over lengths, which eval-suite reports for every
benchmark, are eval/stats.py's; a prediction file is read by eval/predictions.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from longctx.eval.ruler.constants import EFFECTIVE_THRESHOLD, FAMILIES, TASKS
from longctx.eval.ruler.tokens import RulerError

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    return _CONTROL.sub("\n", prediction.strip()).strip()


def match_all(prediction: str, references: Sequence[str]) -> float:
    text = prediction.lower()
    return sum(1.0 for r in references if r.lower() in text) / len(references)


def match_part(prediction: str, references: Sequence[str]) -> float:
    text = prediction.lower()
    return max(1.0 if r.lower() in text else 0.0 for r in references)


METRICS = {"string_match_all": match_all, "string_match_part": match_part}


def metric_of(task: str) -> str:
    if task not in TASKS:
        raise RulerError(f"RULER task {task!r} is not one of {list(TASKS)}")
    return FAMILIES[TASKS[task].family].metric


def sample_score(task: str, prediction: str, references: Sequence[str]) -> float:
    """One sample's score in [0, 1] (before RULER's x100 and rounding)."""
    if not references:
        raise RulerError(f"task {task!r}: a sample has no references")
    return METRICS[metric_of(task)](postprocess(prediction), references)


def task_score(task: str, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """100 x mean sample score, rounded to 2 decimals, as RULER's metric functions return it."""
    if not predictions or len(predictions) != len(references):
        raise RulerError(f"task {task!r}: {len(predictions)} predictions for {len(references)} reference lists")
    scores = [sample_score(task, p, [str(o) for o in r]) for p, r in zip(predictions, references, strict=True)]
    return round(sum(scores) / len(scores) * 100, 2)


def effective_length(scores_by_length: Mapping[int, float], threshold: float = EFFECTIVE_THRESHOLD) -> int | None:
    """The largest tested length whose score exceeds the threshold (None: none does)."""
    passing = [length for length, score in scores_by_length.items() if score > threshold]
    return max(passing) if passing else None


def suite_name(tasks: Iterable[str]) -> str:
    """'RULER' for all 13 tasks, 'RULER-11' for the 11 synthetic ones, else 'RULER subset (k tasks)'."""
    chosen = set(tasks)
    if chosen == set(TASKS):
        return "RULER"
    if chosen == set(TASKS) - {"qa_1", "qa_2"}:
        return "RULER-11"
    return f"RULER subset ({len(chosen)} tasks)"
