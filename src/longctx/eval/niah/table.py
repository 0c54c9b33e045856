"""STRING Table 1 / Table 4 on the evaluation engine: `longctx niah-table`.

    longctx niah-table CKPT_A CKPT_B --methods rope,ntk,yarn,rerope,self_extend,dca,string
    longctx niah-table DIR experiments/real/smollm2_table1.yaml eval.niah.tests_per_length=50 --lengths 2048,8192

Every position method (row) on every checkpoint (column) at the model's training length
L (= model.max_position; STRING Table 1), or at each of `--lengths` (columns
"model@length"): NIAH 4-needle accuracy with its Wilson 95% interval and test count, and
the depth band where each model fails most under the first method (Table 4's "peak
failure depth", over all its evaluated lengths). Parameters that depend on L (StRing's
S = L/3, the baselines' 2/3 L) come from the training length, whatever the test length.

Each (model, method, length) is a cell of the engine (eval/cells.py): its tests are
`eval.niah.tests_per_length` NIAH samples of (eval.niah.seed, task, length, index), written
under `<cells>/` as they finish, skipped by a rerun, resumed after a kill; the table is
assembled from the cells. A length below the task's prompt overhead is left out (as the
search skips it). Progress: a bar per cell and a line per finished cell (eval/cell_progress.py);
W&B: the cells and the table (`log_table`, offline unless a key is configured).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from longctx.config import ExperimentConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.eval.cell_progress import CellProgress
from longctx.eval.cells import CellResult, Decoding, Grid, run_grid, too_short
from longctx.eval.effective_length import answer_depths, band_recall
from longctx.eval.niah.evaluation import peak_failure_band, search_task
from longctx.eval.niah.haystack import Haystack
from longctx.eval.prompt_frame import TextTokenizer
from longctx.eval.ranks import Ranks
from longctx.model.llama import Llama


def niah_grid(
    models: dict[str, Llama],
    arms: dict[str, PositionMethodConfig],
    config: ExperimentConfig,
    haystack: Haystack | None,
    lengths: list[int] | None = None,
) -> Grid:
    """The table's cells: every arm on every model at `lengths` (None: its training length),
    of the task the search runs (`search_task`: eval.niah.task, a NIAH task or another
    benchmark's `<benchmark>-<task>`)."""
    task = search_task(config.eval.niah, config, haystack)
    return Grid(models, arms, [task], lengths, seed=config.eval.niah.seed, count=config.eval.niah.tests_per_length)


def depth_recall(records: list[dict[str, Any]], bands: int) -> list[float]:
    """Recall per needle-depth band (NaN where no answer fell), as eval/effective_length.py
    bins it; all NaN for records without depths (another benchmark's task)."""
    depths, hits = answer_depths(records)
    return band_recall(depths, hits, bands).tolist()


def assemble_table(
    results: list[CellResult], models: dict[str, Llama], lengths: list[int] | None, depth_bands: int
) -> dict:
    """{column: {arm: {"accuracy", "passed", "tests", "wilson", "peak_failure_depth"}}} from
    the cells; the peak failure depth of (model, arm) pools its cells of every length. A task
    with fractional scores (some of another benchmark's) has its mean score as accuracy and
    no passes or interval."""
    edges = np.linspace(0, 1, depth_bands + 1).tolist()
    pooled: dict[tuple[str, str], list[dict]] = {}
    for result in results:
        pooled.setdefault((result.cell.model, result.cell.method), []).extend(result.records)
    table: dict = {}
    for model_name, model in models.items():
        for length in sorted(set(lengths or [model.config.max_position])):
            table[model_name if not lengths else f"{model_name}@{length}"] = {}
    for result in results:
        cell, summary = result.cell, result.summary
        column = cell.model if not lengths else f"{cell.model}@{cell.length}"
        recall = depth_recall(pooled[(cell.model, cell.method)], depth_bands)
        if "passed" in summary:
            entry = {
                "accuracy": summary["passed"] / summary["count"],
                "passed": summary["passed"],
                "tests": summary["count"],
                "wilson": tuple(summary["wilson"]),
            }
        else:
            entry = {"accuracy": summary["score"], "tests": summary["count"]}
        table[column][cell.method] = {**entry, "peak_failure_depth": peak_failure_band(recall, edges)}
    return table


def method_table(
    models: dict[str, Llama],
    arms: dict[str, PositionMethodConfig],
    config: ExperimentConfig,
    tokenizer: TextTokenizer,
    haystack: Haystack | None,
    lengths: list[int] | None = None,
    *,
    cells_dir: str | Path,
    progress: CellProgress | None = None,
    ranks: Ranks | None = None,
) -> tuple[dict, list[CellResult]]:
    """The table (`assemble_table`) and its cells, run or reused under `cells_dir` (dealt to
    `ranks`, eval/ranks.py; None: this process alone)."""
    grid = niah_grid(models, arms, config, haystack, lengths)
    results = run_grid(grid, tokenizer, cells_dir, Decoding.of(config), progress, on_error=too_short, ranks=ranks)
    return assemble_table(results, models, lengths, config.eval.niah.depth_bands), results


def _entry(entry: dict | None) -> str:
    """Accuracy in %, with its Wilson 95% interval and test count when the entry has them."""
    if entry is None:
        return "-"
    if "wilson" not in entry:
        return f"{100 * entry['accuracy']:.1f}"
    low, high = entry["wilson"]
    return f"{100 * entry['accuracy']:.1f} [{100 * low:.0f}, {100 * high:.0f}] n={entry['tests']}"


def format_table(table: dict, methods: list[str]) -> str:
    """Markdown in the STRING Table 1 layout (methods as rows, models as columns; cells:
    accuracy %, Wilson 95% interval, tests), then the peak-failure depth of each model
    under the first method (Table 4); "-" where a cell was not evaluated."""
    models = list(table)
    lines = ["| method | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for name in methods:
        cells = [_entry(table[m].get(name)) for m in models]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"| model | peak failure depth ({methods[0]}) |")
    lines.append("|---|---|")
    for model in models:
        low, high = table[model].get(methods[0], {}).get("peak_failure_depth", (math.nan, math.nan))
        lines.append(f"| {model} | {100 * low:.0f}-{100 * high:.0f}% |")
    return "\n".join(lines)


def log_table(config: ExperimentConfig, table: dict, results: list[CellResult], methods: list[str], out_dir) -> None:
    """One W&B run (job `niah-table`, under `<out_dir>/wandb/`, offline unless a key is
    configured; none when log.wandb_mode=disabled): a table of every cell and the method x
    model accuracy table."""
    from longctx.wandb_setup import finish_run, start_run

    run = start_run(config, "niah-table", out_dir)
    if run is None:  # disabled: wandb need not be installed (the GPU image has none)
        return
    import wandb

    cells = wandb.Table(
        columns=["model", "method", "task", "length", "tests", "score", "wilson_low", "wilson_high", "seconds"],
        data=[
            [
                r.cell.model,
                r.cell.method,
                r.cell.task,
                r.cell.length,
                r.summary["count"],
                r.summary["score"],
                *r.summary.get("wilson", [math.nan, math.nan]),
                r.summary.get("seconds", 0.0),
            ]
            for r in results
        ],
    )
    columns = list(table)
    accuracy = wandb.Table(
        columns=["method", *columns],
        data=[[m, *[table[c].get(m, {}).get("accuracy", math.nan) for c in columns]] for m in methods],
    )
    run.log({"niah_table/cells": cells, "niah_table/accuracy": accuracy})
    finish_run(run)
