"""The STRING figures' data, derived from the loaders' frames (STRING §3 Figure 2, §4 Figure 7, Table 1).

    from longctx.analysis.tables import effective_length_table, ablation_grid, table1, table1_markdown
    effective_length_table(history, fi)     # Fig. 2a/2b: tokens_seen, effective_length, f_at_effective_length
    ablation_grid(frames.results)           # Fig. 7: local_window (rows) x shift_ratio (columns) of StRing
    table1(frames.results)                  # Table 1: NIAH accuracy at L, methods (rows) x models (columns)
    table1_markdown(frames.results)         # the same through eval.niah.table.format_table (+ Table 4 depths)
    sft_settings(runs)                      # SkipAlign: variant, strategy, p, window, extended_length per SFT run
    beyond_window_table(fi, 512, fi_snapshots(runs))  # SkipAlign Fig. 2 in numbers: pairs beyond the window

Figure 2 pairs each effective-length probe of a run with what training had consumed when
it ran: (a) tokens seen, (b) f(L_eff - 1), the trained pairs at the largest relative
position inside the effective length — what the NIAH callback logs as
`niah/f_at_effective_length` (train/callbacks/niah.py). Where W&B did not record it,
it is read from the f(i) snapshot of the same step when one exists (checkpoint steps).
Tokens seen at a probe step come from `train/tokens_seen` of that step; where that step
did not log it (W&B with log.every_steps > 1) it is step x tokens per step (the run's
`train/tokens_seen / step`, constant by construction: train.global_batch_tokens).

SkipAlign Figure 2 is f(i) of the SFT rows (response-token queries): Normal-SFT keeps every
pair inside the original window (`data.window`, the rows' length); SkipAlign moves a p%
share of them beyond it, up to `sft.extended_length`. `beyond_window_table` counts that
share in each run's last f(i) snapshot, pairs past the snapshot's last bin (`overflow`)
included when the `fi_snapshots` frame is given.

Table 1 and Figure 7 read evaluations of finished checkpoints: results with a training
`step` (in-training probes) are left out. A cell with two evaluations is an error naming
both, so nothing is averaged silently: select with `results[...]` first.
"""

from __future__ import annotations

import math

import pandas as pd

from longctx.analysis.fi import f_at
from longctx.analysis.runs import wide

FIGURE2_METRICS = ["train/tokens_seen", "niah/effective_length", "niah/f_at_effective_length"]


def effective_length_table(history: pd.DataFrame, fi: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per NIAH probe: run, step, tokens_seen, effective_length, f_at_effective_length."""
    table = wide(history, FIGURE2_METRICS)
    per_step = (table["train/tokens_seen"] / table["step"]).groupby(table["run"]).median()
    probes = table[table["niah/effective_length"].notna()].copy()
    rows = []
    for row in probes.itertuples(index=False):
        run, step, tokens, length, frequency = row
        if math.isnan(tokens):
            tokens = step * per_step.get(run, math.nan)
        if math.isnan(frequency) and fi is not None and length > 0:
            frequency = f_at(fi, run, step, int(length) - 1)
        rows.append((run, int(step), tokens, length, frequency))
    columns = ["run", "step", "tokens_seen", "effective_length", "f_at_effective_length"]
    return pd.DataFrame(rows, columns=columns).astype(
        {"step": "int64", "tokens_seen": "float64", "effective_length": "float64", "f_at_effective_length": "float64"}
    )


def _checkpoint_results(results: pd.DataFrame) -> pd.DataFrame:
    return results[results["step"].isna()]


def _unique_cells(results: pd.DataFrame, keys: list[str], what: str) -> None:
    duplicated = results[results.duplicated(keys, keep=False)]
    if len(duplicated):
        first = duplicated.groupby(keys, dropna=False)["source"].apply(list).iloc[0]
        raise ValueError(f"{what}: several evaluations for one cell ({', '.join(map(str, first))}); select one first")


def ablation_grid(
    results: pd.DataFrame,
    value: str = "effective_length",
    rows: str = "local_window",
    columns: str = "shift_ratio",
    method: str = "string",
) -> pd.DataFrame:
    """STRING Figure 7: `value` (effective_length or accuracy) of `method` evaluations,
    one row per `rows` parameter value and one column per `columns` value (W x S for StRing)."""
    chosen = _checkpoint_results(results)
    chosen = chosen[chosen["method"] == method]
    missing = [name for name in (rows, columns, value) if name not in chosen.columns]
    if missing or chosen.empty:
        raise ValueError(
            f"no {method} evaluations with parameters {rows} and {columns} "
            f"(missing {missing or 'rows'}; columns present: {list(results.columns)})"
        )
    chosen = chosen[chosen[rows].notna() & chosen[columns].notna()]
    _unique_cells(chosen, [rows, columns], "ablation_grid")
    grid = chosen.pivot(index=rows, columns=columns, values=value).sort_index().sort_index(axis=1)
    return grid.astype(float)


def table1(results: pd.DataFrame) -> pd.DataFrame:
    """STRING Table 1: pass rate at L (`accuracy`), one row per method label (method with
    its non-default parameters), one column per model (`run`); rope first."""
    chosen = _checkpoint_results(results)
    _unique_cells(chosen, ["label", "run"], "table1")
    table = chosen.pivot(index="label", columns="run", values="accuracy")
    order = sorted(table.index, key=lambda label: (label != "rope", list(chosen["label"]).index(label)))
    table = table.reindex(index=order, columns=list(dict.fromkeys(chosen["run"])))
    table.index.name, table.columns.name = "method", "model"
    return table.astype(float)


def table1_markdown(results: pd.DataFrame) -> str:
    """Table 1 (and Table 4's peak failure depth under the first method) as markdown, in the
    layout of `longctx niah-table` (eval.niah.table.format_table)."""
    from longctx.eval.niah.table import format_table

    chosen = _checkpoint_results(results)
    accuracy = table1(chosen)
    depth = {(row.label, row.run): (row.failure_depth_low, row.failure_depth_high) for row in chosen.itertuples()}
    nested = {
        model: {
            label: {
                "accuracy": accuracy.loc[label, model],
                "peak_failure_depth": depth.get((label, model), (math.nan, math.nan)),
            }
            for label in accuracy.index
        }
        for model in accuracy.columns
    }
    return format_table(nested, list(accuracy.index))


SFT_SETTINGS = ["variant", "strategy", "p", "p_scope", "extended_length", "rope_extension"]


def sft_settings(run_dirs) -> pd.DataFrame:
    """One row per SFT run directory (a list or a {label: dir} mapping): run, window (the
    config's `data.window`, the original window of the rows), the `sft.*` settings of
    SFT_SETTINGS and init, from `checkpoints/last.ckpt`'s hyper_parameters["config"]."""
    from longctx.analysis.runs import recorded_configs

    rows = []
    for label, experiment in recorded_configs(run_dirs, "sft"):
        settings = [experiment["sft"].get(key) for key in SFT_SETTINGS]
        rows.append((label, int(experiment["data"]["window"]), *settings, experiment.get("init")))
    return pd.DataFrame(rows, columns=["run", "window", *SFT_SETTINGS, "init"])


def beyond_window_table(fi: pd.DataFrame, window: int | dict, snapshots: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per run (its last f(i) snapshot): run, step, window, pairs (all trained pairs),
    beyond (pairs at relative distance >= window), fraction_beyond, max_distance (the largest
    distance with a pair). `window`: one for all runs or {run: window}; `snapshots`
    (`fi.fi_snapshots`) adds each snapshot's overflow to pairs and beyond."""
    overflow = {} if snapshots is None else {(r.run, r.step): r.overflow for r in snapshots.itertuples()}
    rows = []
    for run, frame in fi.groupby("run", sort=False):
        step = int(frame["step"].max())
        last = frame[frame["step"] == step]
        limit = int(window[run] if isinstance(window, dict) else window)
        extra = int(overflow.get((run, step), 0))
        pairs = int(last["count"].sum()) + extra
        beyond = int(last.loc[last["distance"] >= limit, "count"].sum()) + extra
        used = last.loc[last["count"] > 0, "distance"]
        fraction = beyond / pairs if pairs else math.nan
        rows.append((run, step, limit, pairs, beyond, fraction, int(used.max()) if len(used) else -1))
    return pd.DataFrame(rows, columns=["run", "step", "window", "pairs", "beyond", "fraction_beyond", "max_distance"])
