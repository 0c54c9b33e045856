"""HELMET's model-judged summary score (scripts/eval_gpt4_summ.py) for InfiniteBench Sum and
Multi-LexSum, with a local judge model in place of GPT-4o (a deviation, reported beside the
n-gram metrics; the numbers are not comparable with HELMET's).

Key points: HELMET does not extract them at scoring time; its released data carries them,
read by row id: `infbench/longbook_sum_eng_keypoints.jsonl` ("keypoints") and
`multi_lexsum/multi_lexsum_val.jsonl` ("summary/short_keypoints") under its data/ directory.

Per row the judge answers three prompts (eval/helmet/summ_prompts.py), each on the output
with surrounding whitespace stripped:
    fluency    the output alone                                  -> {"fluency": 0 | 1}
    recall     the key points numbered "1. ..." one a line       -> {"recall": k}
    precision  the expert summary (Multi-LexSum: summary/long;   -> {"precision": s,
               InfiniteBench: answer[0]) and the output              "sentence_count": c}
Each reply is read as HELMET's parse_json does: the last {...} as JSON, else, when that is
not JSON, the text between the first ```json and the last ```; else no score. A row with any
reply unread is left out (HELMET's rule). Then, with n key points,
    recall = k / n (0 when n = 0),  precision = s / c (0 when c = 0),
    F1 = fluency x 2 x recall x precision / (recall + precision)  (0 when both are 0),
fluency gating F1 so that a degenerate summary scores 0 whatever it covers. No clamping: a
judge counting more points than there are gives recall > 1, as in HELMET. The file's score
is 100 x the mean F1 over the rows judged (collect_results.py's gpt-4-f1 x 100); recall,
precision and fluency are reported as 100 x their means beside it.

A reply that is JSON but lacks a key or holds a non-number stops HELMET's script (KeyError,
TypeError); here the row is left out and counted as `unread`, so one bad reply of a small
local judge does not void the file. No row judged at all is an error, as in HELMET.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.eval.helmet import judge as judge_model
from longctx.eval.helmet.generator import HelmetError
from longctx.eval.helmet.summ_prompts import (
    FLUENCY_PROMPT,
    FLUENCY_PROMPT_BOOK,
    PRECISION_PROMPT,
    PRECISION_PROMPT_BOOK,
    RECALL_PROMPT,
    RECALL_PROMPT_BOOK,
)

PROMPTS = {
    "multi_lexsum": (FLUENCY_PROMPT, RECALL_PROMPT, PRECISION_PROMPT),
    "infbench_sum": (FLUENCY_PROMPT_BOOK, RECALL_PROMPT_BOOK, PRECISION_PROMPT_BOOK),
}
"""(fluency, recall, precision) templates per task."""

KEYPOINT_FILES = {
    "infbench_sum": ("infbench/longbook_sum_eng_keypoints.jsonl", "keypoints"),
    "multi_lexsum": ("multi_lexsum/multi_lexsum_val.jsonl", "summary/short_keypoints"),
}
"""(file under HELMET's data/, the key-point field) per task, as check_metrics reads them."""

MAX_NEW_TOKENS = 4096
"""The judge's generation limit: HELMET's OpenAIModel(..., generation_max_length=4096)."""


@dataclass(frozen=True)
class SummaryRow:
    """What the judge reads of one row: the model's output, the reference's key points and
    the expert summary the precision prompt compares against."""

    output: str
    keypoints: tuple[str, ...]
    expert_summary: str


def summary_prompts(task: str, row: SummaryRow) -> tuple[str, str, str]:
    """check_metrics's (fluency, recall, precision) prompts of one row."""
    fluency, recall, precision = PROMPTS[task]
    output = row.output.strip()
    numbered = "\n".join(f"{i + 1}. {point}" for i, point in enumerate(row.keypoints))
    return (
        fluency.format(text=output),
        recall.format(keypoints=numbered, summary=output),
        precision.format(expert_summary=row.expert_summary, summary=output),
    )


def parse_json(text: str) -> Any:
    """eval_gpt4_summ.py's parse_json: the last {...} (non-greedy, across lines) as JSON; when
    that fails, the greedy ```json ... ``` block; None when neither reads."""
    matches = re.findall(r"\{.*?\}", text, re.DOTALL)
    if not matches:
        return None
    try:
        return json.loads(matches[-1])
    except json.JSONDecodeError:
        pass
    blocks = re.findall(r"(?:```json)(.+)(?:```)", text, re.DOTALL)
    if not blocks:
        return None
    try:
        return json.loads(blocks[-1])
    except json.JSONDecodeError:
        return None


def _number(reply: Any, key: str) -> float | None:
    value = reply.get(key) if isinstance(reply, dict) else None
    return float(value) if isinstance(value, int | float) else None


def row_scores(keypoints: int, replies: Sequence[str]) -> dict[str, float] | None:
    """The row's {fluency, recall, precision, f1} from its three replies and its number of key
    points; None when a reply has no JSON or lacks its numbers (the row is left out)."""
    fluency_reply, recall_reply, precision_reply = (parse_json(r) for r in replies)
    if fluency_reply is None or recall_reply is None or precision_reply is None:
        return None
    fluency, found = _number(fluency_reply, "fluency"), _number(recall_reply, "recall")
    supported, sentences = _number(precision_reply, "precision"), _number(precision_reply, "sentence_count")
    if fluency is None or found is None or supported is None or sentences is None:
        return None
    recall = found / keypoints if keypoints > 0 else 0.0
    precision = supported / sentences if sentences > 0 else 0.0
    f1 = fluency * 2 * (recall * precision) / (recall + precision) if recall + precision > 0 else 0.0
    return {"fluency": fluency, "recall": recall, "precision": precision, "f1": f1}


def judged_summaries(task: str, rows: Sequence[SummaryRow], judge: judge_model.Judge) -> dict[str, Any]:
    """{"judge_score": 100 x mean F1, "judge_recall" / "judge_precision" / "judge_fluency":
    100 x their means, "judged": rows scored, "unread": rows left out} over the rows."""
    scored: list[dict[str, float]] = []
    for row in rows:
        replies = [judge(prompt) for prompt in summary_prompts(task, row)]
        scores = row_scores(len(row.keypoints), replies)
        if scores is not None:
            scored.append(scores)
    if not scored:
        raise HelmetError(f"HELMET {task}: no reply of the judge held HELMET's JSON scores: no judged score")
    means = {key: 100 * sum(s[key] for s in scored) / len(scored) for key in ("f1", "recall", "precision", "fluency")}
    result = {"judge_score": round(means.pop("f1"), 4)}
    result |= {f"judge_{key}": round(value, 4) for key, value in means.items()}
    return {**result, "judged": len(scored), "unread": len(rows) - len(scored)}


def read_keypoints(task: str, data_dir: str) -> dict[str, dict[str, Any]]:
    """HELMET's key-point rows of the task by str(id); a one-line HelmetError naming the file
    (or the option) when it cannot be read."""
    relative, field = KEYPOINT_FILES[task]
    if not data_dir:
        raise HelmetError(
            f"HELMET {task}: the judge reads HELMET's key points ({relative}): eval-score --helmet-data DIR"
        )
    file = Path(data_dir) / relative
    if not file.is_file():
        raise HelmetError(f"--helmet-data {data_dir}: {file} not found (HELMET's key points of {task})")
    rows: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise HelmetError(f"{file}: line {number} is not JSON ({error})") from error
        if not isinstance(row, dict) or "id" not in row or not isinstance(row.get(field), list):
            raise HelmetError(f"{file}: line {number} needs 'id' and a list {field!r}")
        rows[str(row["id"])] = row
    return rows


def summary_rows(
    task: str,
    file_rows: Sequence[Mapping[str, Any]],
    predictions: Sequence[str],
    references: Sequence[Sequence[Any]],
    keypoints: Mapping[str, Mapping[str, Any]],
    source: str,
) -> list[SummaryRow]:
    """The judge's rows: each prediction with the key points of its row's id and its expert
    summary (InfiniteBench: the first reference; Multi-LexSum: the row's summary/long, else
    the key-point file's). `source` names the prediction file in errors."""
    field = KEYPOINT_FILES[task][1]
    rows = []
    for number, (row, output, golds) in enumerate(zip(file_rows, predictions, references, strict=True)):
        if "id" not in row:
            raise HelmetError(f"{source}: row {number} has no 'id' (the judge finds its key points by it)")
        point_row = keypoints.get(str(row["id"]))
        if point_row is None:
            raise HelmetError(f"{source}: row {number}'s id {row['id']!r} has no key points in HELMET's file")
        expert = golds[0] if task == "infbench_sum" else row.get("summary/long") or point_row.get("summary/long")
        if not isinstance(expert, str):
            raise HelmetError(f"{source}: row {number} has no expert summary (Multi-LexSum: 'summary/long')")
        rows.append(SummaryRow(output, tuple(str(p) for p in point_row[field]), expert))
    return rows


def judge_summary_file(
    task: str,
    file_rows: Sequence[Mapping[str, Any]],
    predictions: Sequence[str],
    references: Sequence[Sequence[Any]],
    paths: Mapping[str, str],
) -> dict[str, Any]:
    """The judged score of a summary prediction file: paths["judge"] the local judge model,
    paths["helmet_data"] HELMET's data/ (its key points), paths["path"] the prediction file.
    The key points and rows are checked before the judge model loads."""
    keypoints = read_keypoints(task, paths.get("helmet_data", ""))
    rows = summary_rows(task, file_rows, predictions, references, keypoints, paths.get("path", ""))
    judge = judge_model.load_judge(paths["judge"], MAX_NEW_TOKENS)
    return {**judged_summaries(task, rows, judge), "judge_model": paths["judge"]}
