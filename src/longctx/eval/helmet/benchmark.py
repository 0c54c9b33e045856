"""HELMET in the benchmark registry (eval/registry.py): its recall, RAG, re-ranking,
many-shot ICL, long-document QA, summarization and citation tasks in those categories; recall by default, every task once
eval.benchmarks.helmet_dir names HELMET's data; the category means in the suite's table
(HELMET reports category averages); `eval-score` reads HELMET's own output files (its
eval.py's JSON, `data` rows with `output`, `answer` and, for MS MARCO, `qrel`) and longctx's
prediction lines alike."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longctx.config import ExperimentConfig
from longctx.errors import DataError
from longctx.eval.helmet.generator import TASKS
from longctx.eval.helmet.scoring import task_score
from longctx.eval.registry import BenchmarkSpec, register_benchmark

if TYPE_CHECKING:
    from longctx.eval.task import Task


def default_tasks(config: ExperimentConfig) -> list[str]:
    """Recall (no data file needed), and every other task when eval.benchmarks.helmet_dir is set."""
    if config.eval.benchmarks.helmet_dir:
        return list(TASKS)
    return [task for task, info in TASKS.items() if info.category == "recall"]


def engine_tasks(names: list[str], config: ExperimentConfig, haystack: Any) -> list[Task]:
    from longctx.eval.helmet.engine_task import HelmetTask, RecallTask

    return [
        RecallTask(name, config, haystack) if TASKS[name].category == "recall" else HelmetTask(name, config)
        for name in names
    ]


def read_file(path: str | Path) -> tuple[list[str], list[list]]:
    """HELMET's output JSON ({"data": [{"output", "answer" | "qrel"}]}), else prediction lines
    (`pred`, `outputs`) as longctx's cells write them."""
    from longctx.eval.predictions import read_predictions

    text = Path(path).read_text(encoding="utf-8")
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return read_predictions(path)
    if not isinstance(document, dict) or "data" not in document:
        return read_predictions(path)
    outputs: list[str] = []
    references: list[list] = []
    for number, row in enumerate(document["data"]):
        if "docs" in row and ("qa_pairs" in row or "answers" in row):  # ALCE: question, docs and golds
            keep = ("question", "docs", "qa_pairs") if "qa_pairs" in row else ("question", "docs", "answers")
            outputs.append(row.get("output", ""))
            references.append([{k: row[k] for k in keep if k in row}])
            continue
        if "output" not in row or not ("qrel" in row or "answer" in row):
            raise DataError(f"{path}: data[{number}] has no 'output' and 'answer' (or 'qrel') (HELMET's output file)")
        outputs.append(row["output"])
        answer = row["qrel"] if "qrel" in row else row["answer"]
        references.append([answer] if isinstance(answer, str) else list(answer))
    if not outputs:
        raise DataError(f"{path}: no rows in 'data'")
    return outputs, references


_NGRAM = (
    "exact_match",
    "f1",
    "substring_exact_match",
    "rougeL_f1",
    "rougeL_recall",
    "rougeLsum_f1",
    "rougeLsum_recall",
)
JUDGED = ("narrativeqa", "infbench_sum", "multi_lexsum")
"""The tasks HELMET reports by GPT-4o's judgement (gpt-4-score, gpt-4-f1)."""


def score_file(
    task: str, predictions: list[str], references: list[list], options: Mapping[str, str]
) -> float | dict[str, Any]:
    """HELMET's reported metric, 0-100, on outputs as HELMET writes them (system template
    first); for long-document QA and summarization every n-gram metric beside it, for ALCE
    its metrics with citation recall and precision (options["nli"]: the NLI model's path)."""
    score = round(task_score(task, predictions, references), 4)
    kind = TASKS[task].kind
    if kind == "alce":
        return _alce_scores(task, predictions, references, options.get("nli", ""), score)
    if kind not in ("narrativeqa", "infbench_qa", "infbench_sum", "multi_lexsum"):
        return score
    from longctx.eval.helmet.scoring import parse_prefix, post_processed

    rows = [post_processed(p, r, parse_prefix(kind)) for p, r in zip(predictions, references, strict=True)]
    result: dict[str, Any] = {"score": score}
    result |= {k: round(100 * sum(m[k] for m in rows) / len(rows), 4) for k in _NGRAM}
    if task in JUDGED:
        result["judge"] = _judge(task, predictions, references, options)
    return result


def _judge(task: str, predictions: list[str], references: list[list], options: Mapping[str, str]) -> Any:
    """HELMET's GPT-4o judgement replaced by a local model (docs/helmet.md: deviations); the
    questions (NarrativeQA) and row ids (the summaries' key points) are read from the
    prediction file (HELMET's rows and longctx's cells hold them)."""
    path = options.get("judge", "")
    if not path:
        return "not run: --judge PATH names a local judge model (HELMET: GPT-4o); the n-gram metrics stand alone"
    rows = _file_rows(options.get("path", ""), len(predictions))
    if task != "narrativeqa":
        from longctx.eval.helmet.summ_judge import judge_summary_file

        return judge_summary_file(task, rows, predictions, references, options)
    from longctx.eval.helmet.judge import judge_scores

    questions = [row.get("question") for row in rows]
    if any(not isinstance(q, str) for q in questions):
        raise DataError(f"{options.get('path', '')}: the judge needs each row's 'question' ({len(rows)} rows)")
    golds = [[str(a) for a in r] for r in references]
    return judge_scores(task, list(zip([str(q) for q in questions], golds, predictions, strict=True)), path)


def _file_rows(path: str, count: int) -> list[dict[str, Any]]:
    """The prediction file's rows: HELMET's `data` list or longctx's JSON lines."""
    text = Path(path).read_text(encoding="utf-8") if path else ""
    try:
        rows = json.loads(text)["data"]
    except (json.JSONDecodeError, KeyError, TypeError):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if len(rows) != count or any(not isinstance(row, dict) for row in rows):
        raise DataError(f"{path}: the judge needs the file's {count} rows as JSON objects")
    return rows


def _alce_scores(
    task: str, predictions: list[str], references: list[list], nli_path: str, score: float
) -> dict[str, Any]:
    from longctx.eval.helmet.citations import citation_scores, load_nli
    from longctx.eval.helmet.scoring import qampari_scores, str_em

    nli = load_nli(nli_path)  # one-line refusal without a path
    items = [r[0] if isinstance(r, list) else r for r in references]
    qampari = "answers" in items[0]
    result: dict[str, Any] = {"score": score}
    if qampari:
        rows = [qampari_scores(p, item["answers"]) for p, item in zip(predictions, items, strict=True)]
        result |= {f"qampari_{k}": round(100 * sum(r[k] for r in rows) / len(rows), 4) for k in rows[0]}
    else:
        result["str_em"] = round(
            100 * sum(str_em(p, i["qa_pairs"]) for p, i in zip(predictions, items, strict=True)) / len(items), 4
        )
    rows_in = [
        {"output": p, "question": i["question"], "docs": i["docs"]} for p, i in zip(predictions, items, strict=True)
    ]
    result |= {k: round(v, 4) for k, v in citation_scores(rows_in, nli, qampari).items()}
    return result


SPEC = register_benchmark(
    BenchmarkSpec(
        "helmet",
        "HELMET's recall, RAG, re-ranking, ICL, long-doc QA, summarization, citations (Yen et al. 2025, ICLR)",
        tasks={task: info.category for task, info in TASKS.items()},
        build=engine_tasks,
        defaults=default_tasks,
        score_file=score_file,
        read_file=read_file,
        category_means=True,
        order=4,
    )
)
