"""STRING Table 2 / Table 3 on the evaluation engine: `longctx eval-suite`.

    longctx eval-suite hf/smollm2 --suite ruler --lengths 1024,2048,4096 --methods rope,string
    longctx eval-suite CKPT --suite infinitebench --tasks passkey,kv_retrieval --lengths 131072

Every position method on every checkpoint, for each task of the suite (a registered
benchmark, eval/registry.py) at each length: one cell of the engine (eval/cells.py;
eval.benchmarks.samples_per_length samples, written as they finish, reused by a rerun,
resumed after a kill). The table, per length: methods x tasks (score 0-100 with its 95%
interval: Wilson's for pass/fail scores, mean +- 1.96 s/sqrt(n) otherwise), the mean of
each category for a benchmark that asks for it (HELMET) and the mean over tasks; then per method: the mean at each length, Avg., wAvg. (inc/dec) (eval/stats.py)
and, for a benchmark that defines one, its effective length (RULER: the largest length
whose mean exceeds 85.6, eval/ruler/scoring.py). The mean is named by the benchmark for the
tasks it covers (RULER: "RULER" only for all 13, "RULER-11" for the synthetic 11, never
"RULER" for fewer), else "<suite> mean (k tasks)". Written as JSON and Markdown, logged to
W&B (offline unless a key is configured).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from longctx.config import ExperimentConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.eval.cell_progress import CellProgress
from longctx.eval.cells import Cell, CellResult, Decoding, Grid, run_grid, too_short
from longctx.eval.prompt_frame import TextTokenizer
from longctx.eval.ranks import Ranks
from longctx.eval.registry import benchmark_spec
from longctx.eval.stats import averages
from longctx.eval.task import Task
from longctx.model.llama import Llama


def suite_tasks(suite: str, names: list[str] | None, config: ExperimentConfig, haystack: Any = None) -> list[Task]:
    """The suite's engine tasks: `names` (tasks or categories of the benchmark), or its
    defaults (RULER's 11 synthetic tasks, plus qa_1/qa_2 when their files are configured;
    every InfiniteBench task; the configured NIAH); `haystack`: the one loaded for eval.niah."""
    return benchmark_spec(suite).engine_tasks(names, config, haystack)


def _interval(result: CellResult) -> tuple[float, float]:
    summary = result.summary
    if "wilson" in summary:
        return 100 * summary["wilson"][0], 100 * summary["wilson"][1]
    scores = [record["score"] for record in result.records]
    mean = sum(scores) / len(scores)
    spread = math.sqrt(sum((s - mean) ** 2 for s in scores) / max(len(scores) - 1, 1)) if len(scores) > 1 else 0.0
    half = 1.96 * spread / math.sqrt(len(scores))
    return 100 * max(0.0, mean - half), 100 * min(1.0, mean + half)


def assemble(results: list[CellResult], suite: str, skipped: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """{"suite", "mean_name", "lengths": {length: {column: {method: {task: entry, "mean": x}}}},
    "summary": {column: {method: {...}}}, "skipped": [{model, method, task, length, reason}]};
    a column is a model."""
    spec = benchmark_spec(suite)
    tasks = list(dict.fromkeys(r.cell.task for r in results))
    short = [spec.column(t) for t in tasks]
    mean_name = spec.mean_name(short) if spec.mean_name else f"{suite} mean ({len(tasks)} tasks)"
    table: dict[str, Any] = {"suite": suite, "tasks": short, "mean_name": mean_name, "lengths": {}, "summary": {}}
    table["skipped"] = list(skipped or [])
    if spec.category_means:
        ran = {spec.column(t): spec.tasks.get(spec.owner_task(t), "") for t in tasks}
        table["categories"] = {c: [t for t in short if ran[t] == c] for c in dict.fromkeys(ran.values()) if c}
    for result in results:
        cell = result.cell
        entry = {"score": 100 * result.summary["score"], "interval": _interval(result), "n": result.summary["count"]}
        column = table["lengths"].setdefault(str(cell.length), {}).setdefault(cell.model, {})
        column.setdefault(cell.method, {})[spec.column(cell.task)] = entry
    for length, models in table["lengths"].items():
        for model, methods in models.items():
            for method, entries in methods.items():
                for category, members in table.get("categories", {}).items():
                    if all(t in entries for t in members):  # the category's mean: each of its tasks ran
                        entries[f"mean:{category}"] = sum(entries[t]["score"] for t in members) / len(members)
                if all(t in entries for t in short):  # every task of the suite ran at this length
                    entries["mean"] = sum(entries[t]["score"] for t in short) / len(short)
                    by_length = table["summary"].setdefault(model, {}).setdefault(method, {"by_length": {}})
                    by_length["by_length"][int(length)] = entries["mean"]
    for methods in table["summary"].values():
        for summary in methods.values():
            summary.update(averages(summary["by_length"]))
            if spec.effective_length is not None:
                summary["effective_length"] = spec.effective_length(summary["by_length"])
    return table


def format_markdown(table: dict[str, Any]) -> str:
    lines: list[str] = []
    tasks, mean = table["tasks"], table["mean_name"]
    categories = list(table.get("categories", {}))
    for length, models in sorted(table["lengths"].items(), key=lambda item: int(item[0])):
        for model, methods in models.items():
            lines += [f"### {model}, length {length}", ""]
            heads = [*tasks, *categories]
            lines.append("| method | " + " | ".join(heads) + f" | {mean} |")
            lines.append("|---|" + "---|" * (len(heads) + 1))
            for method, entries in methods.items():
                cells = []
                for task in tasks:
                    entry = entries.get(task)
                    cells.append(
                        "-"
                        if entry is None
                        else f"{entry['score']:.1f} [{entry['interval'][0]:.0f}, {entry['interval'][1]:.0f}]"
                    )
                for category in categories:
                    value = entries.get(f"mean:{category}")
                    cells.append("-" if value is None else f"{value:.1f}")
                total = entries.get("mean")
                lines.append(f"| {method} | " + " | ".join(cells) + f" | {'-' if total is None else f'{total:.1f}'} |")
            n = {e["n"] for e in entries.values() if isinstance(e, dict)}
            if categories:
                lines.append("category columns: the mean of the category's tasks (HELMET's category averages)")
            lines += ["", f"n = {', '.join(map(str, sorted(n)))} samples per task; [95% interval]", ""]
    for skip in table.get("skipped", []):
        lines.append(
            f"skipped: {skip['task']} at {skip['length']} ({skip['model']}, {skip['method']}): {skip['reason']}"
        )
    if table.get("skipped"):
        lines.append("")
    for model, methods in table["summary"].items():
        lengths = sorted({length for s in methods.values() for length in s["by_length"]})
        extra = " | effective length" if any("effective_length" in s for s in methods.values()) else ""
        lines += [f"### {model}: {mean} by length", ""]
        lines.append(
            "| method | " + " | ".join(map(str, lengths)) + " | Avg. | wAvg. (inc) | wAvg. (dec)" + extra + " |"
        )
        lines.append("|---|" + "---|" * (len(lengths) + 3 + bool(extra)))
        for method, s in methods.items():
            values = [f"{s['by_length'][length]:.1f}" if length in s["by_length"] else "-" for length in lengths]
            row = (
                f"| {method} | " + " | ".join(values) + f" | {s['avg']:.1f} | {s['wavg_inc']:.1f} | {s['wavg_dec']:.1f}"
            )
            if extra:
                row += f" | {s['effective_length'] or '< ' + str(lengths[0])}"
            lines.append(row + " |")
        lines.append("")
    return "\n".join(lines)


def run_suite(
    models: dict[str, Llama],
    arms: dict[str, PositionMethodConfig],
    config: ExperimentConfig,
    tokenizer: TextTokenizer,
    tasks: list[Task],
    lengths: list[int],
    *,
    suite: str,
    cells_dir: str | Path,
    progress: CellProgress | None = None,
    ranks: Ranks | None = None,
) -> tuple[dict[str, Any], list[CellResult]]:
    """The suite's table (`assemble`) and its cells, run or reused under `cells_dir` (dealt
    to `ranks`, eval/ranks.py; None: this process alone); a (task, length) too short for its
    prompt (`too_short`) is left out with a line on stderr and an entry in "skipped"."""
    settings = config.eval.benchmarks
    grid = Grid(models, arms, tasks, lengths, seed=settings.seed, count=settings.samples_per_length)
    left_out: list[tuple[Cell, str]] = []
    results = run_grid(grid, tokenizer, cells_dir, Decoding.of(config), progress, too_short, ranks, left_out)
    skipped = []
    for cell, reason in left_out:
        skipped.append(
            {"model": cell.model, "method": cell.method, "task": cell.task, "length": cell.length, "reason": reason}
        )
        if ranks is None or ranks.lead:
            print(
                f"skipped {cell.task} at length {cell.length} ({cell.model}, {cell.method}): {reason}", file=sys.stderr
            )
    return assemble(results, suite, skipped), results


def log_suite(config: ExperimentConfig, table: dict[str, Any], results: list[CellResult], out_dir) -> None:
    """One W&B run (job `eval-suite`): every cell, and each method's mean by length."""
    from longctx.wandb_setup import finish_run, start_run

    run = start_run(config, "eval-suite", out_dir)
    if run is None:  # disabled: wandb need not be installed (the GPU image has none)
        return
    import wandb

    cells = wandb.Table(
        columns=["model", "method", "task", "length", "samples", "score"],
        data=[
            [r.cell.model, r.cell.method, r.cell.task, r.cell.length, r.summary["count"], 100 * r.summary["score"]]
            for r in results
        ],
    )
    means = wandb.Table(
        columns=["model", "method", "length", table["mean_name"]],
        data=[
            [model, method, length, value]
            for model, methods in table["summary"].items()
            for method, s in methods.items()
            for length, value in s["by_length"].items()
        ],
    )
    run.log({f"{table['suite']}/cells": cells, f"{table['suite']}/means": means})
    finish_run(run)
