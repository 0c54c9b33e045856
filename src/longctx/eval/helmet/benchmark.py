"""HELMET in the benchmark registry (eval/registry.py): its recall, RAG, re-ranking and
many-shot ICL tasks in those categories; recall by default, every task once
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
    outputs, references = [], []
    for number, row in enumerate(document["data"]):
        if "output" not in row or not ("qrel" in row or "answer" in row):
            raise DataError(f"{path}: data[{number}] has no 'output' and 'answer' (or 'qrel') (HELMET's output file)")
        outputs.append(row["output"])
        answer = row["qrel"] if "qrel" in row else row["answer"]
        references.append([answer] if isinstance(answer, str) else list(answer))
    if not outputs:
        raise DataError(f"{path}: no rows in 'data'")
    return outputs, references


def score_file(task: str, predictions: list[str], references: list[list], options: Mapping[str, str]) -> float:
    """HELMET's reported metric, 0-100, on outputs as HELMET writes them (system template first)."""
    return round(task_score(task, predictions, references), 4)


SPEC = register_benchmark(
    BenchmarkSpec(
        "helmet",
        "HELMET's recall, RAG, re-ranking and many-shot ICL at controlled lengths (Yen et al. 2025, ICLR)",
        tasks={task: info.category for task, info in TASKS.items()},
        build=engine_tasks,
        defaults=default_tasks,
        score_file=score_file,
        read_file=read_file,
        category_means=True,
        order=4,
    )
)
