"""NIAH in the benchmark registry (eval/registry.py): its prompt variants (paper,
string-repo, helmet-json-kv: eval/niah/needles.py) as tasks, eval.niah.task by default, each
under the eval.niah settings with its own name. Its table keeps the engine names
(`niah-paper`), and it scores no prediction files: its records hold which answers were
found, not RULER's `pred` / `outputs`."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from longctx.config import ExperimentConfig
from longctx.eval.niah.needles import TASKS
from longctx.eval.registry import BenchmarkSpec, register_benchmark

if TYPE_CHECKING:
    from longctx.eval.task import Task


def engine_tasks(names: list[str], config: ExperimentConfig, haystack: Any) -> list[Task]:
    """A NiahTask per variant: the haystack for those that read one, None for those that
    draw their own (helmet-json-kv's JSON pairs)."""
    from longctx.eval.niah.engine_task import NiahTask

    tasks: list[Task] = []
    for name in names:
        settings = (
            config.eval.niah if name == config.eval.niah.task else dataclasses.replace(config.eval.niah, task=name)
        )
        variant = TASKS.get(name)
        tasks.append(NiahTask(settings, None if variant is not None and variant.json_haystack else haystack))
    return tasks


SPEC = register_benchmark(
    BenchmarkSpec(
        "niah",
        "needle in a haystack: STRING's 4-needle test and its variants (STRING §3, Table 5)",
        tasks=dict.fromkeys(TASKS, ""),
        build=engine_tasks,
        defaults=lambda config: [config.eval.niah.task],
        table_keeps_prefix=True,
        order=3,
    )
)
