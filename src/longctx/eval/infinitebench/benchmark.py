"""InfiniteBench in the benchmark registry (eval/registry.py): its four synthetic tasks in
the paper's categories (Retrieve.PassKey, Retrieve.Number, Retrieve.KV, Math.Find), all by
default, scored by STRING's compute_scores (eval-score's `compat` picks math_find's
integer check)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from longctx.config import ExperimentConfig
from longctx.eval.infinitebench.generator import TASKS
from longctx.eval.infinitebench.scoring import task_score
from longctx.eval.registry import BenchmarkSpec, register_benchmark

if TYPE_CHECKING:
    from longctx.eval.task import Task


CATEGORIES = {"passkey": "retrieve", "number_string": "retrieve", "kv_retrieval": "retrieve", "math_find": "math"}


def engine_tasks(names: list[str], config: ExperimentConfig, haystack: Any) -> list[Task]:
    from longctx.eval.infinitebench.engine_task import InfiniteBenchTask

    return [InfiniteBenchTask(name, config.eval.benchmarks) for name in names]


def score_file(task: str, predictions: list[str], references: list[list], options: Mapping[str, str]) -> float:
    """The first reference of each line is the answer (InfiniteBenchTask writes it so)."""
    answers = [outputs[0] for outputs in references]
    return round(task_score(task, predictions, answers, compat=options.get("compat", "string")), 2)


SPEC = register_benchmark(
    BenchmarkSpec(
        "infinitebench",
        "InfiniteBench's synthetic retrieval and math tasks at any length (Zhang et al. 2024; STRING Table 3)",
        tasks={task: CATEGORIES[task] for task in TASKS},
        build=engine_tasks,
        score_file=score_file,
        order=2,
    )
)
