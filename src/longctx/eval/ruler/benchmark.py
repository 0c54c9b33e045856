"""RULER in the benchmark registry (eval/registry.py): its 13 tasks in their five families,
the 11 synthetic ones by default (qa_1 and qa_2 join when their data files are configured),
RULER's file scorer, its suite name ("RULER" only for all 13) and its effective length
(the largest length whose mean exceeds 85.6)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from longctx.config import ExperimentConfig
from longctx.eval.registry import BenchmarkSpec, register_benchmark
from longctx.eval.ruler import scoring
from longctx.eval.ruler.constants import SYNTHETIC_TASKS, TASKS

if TYPE_CHECKING:
    from longctx.eval.task import Task


def default_tasks(config: ExperimentConfig) -> list[str]:
    """The synthetic 11, plus qa_1 / qa_2 when eval.benchmarks names their files, in RULER's order."""
    settings = config.eval.benchmarks
    names = {*SYNTHETIC_TASKS}
    names |= {task for task, path in (("qa_1", settings.squad_path), ("qa_2", settings.hotpotqa_path)) if path}
    return [task for task in TASKS if task in names]


def engine_tasks(names: list[str], config: ExperimentConfig, haystack: Any) -> list[Task]:
    """One RulerTask per name, sharing one RulerContext per tokenizer (eval.benchmarks' settings)."""
    from longctx.eval.ruler.engine_task import RulerContexts, RulerTask

    contexts = RulerContexts(config.eval.benchmarks)
    return [RulerTask(name, contexts) for name in names]


def score_file(task: str, predictions: list[str], references: list[list], options: Mapping[str, str]) -> float:
    return scoring.task_score(task, predictions, references)


SPEC = register_benchmark(
    BenchmarkSpec(
        "ruler",
        "RULER's 13 tasks at any length, for any tokenizer (Hsieh et al. 2024; STRING Table 2)",
        tasks={name: task.family for name, task in TASKS.items()},
        build=engine_tasks,
        defaults=default_tasks,
        score_file=score_file,
        mean_name=scoring.suite_name,
        effective_length=scoring.effective_length,
        order=1,
    )
)
