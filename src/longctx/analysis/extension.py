"""Context-extension runs side by side (analysis/context_extension.ipynb, docs/context_extension.md).

    settings = extension_settings(runs)          # recipe of each run, from its checkpoint config
    extension_table(settings, fi, snapshots, effective_length_table(history, fi))

A recipe trains rows of `data.window` tokens (L_c) whose position ids reach
`data.target_length` (L_t). Per run the table reports what the last f(i) snapshot holds
(the pairs at relative distance >= L_c, which contiguous L_c-token rows never train, and
the largest distance trained: < L_t by construction) and the NIAH effective length of the
run's last in-training probe and the best one.
"""

from __future__ import annotations

import math

import pandas as pd

from longctx.analysis.runs import recorded_configs
from longctx.analysis.tables import beyond_window_table

SETTINGS = [
    "position_transform",
    "window",
    "target_length",
    "pose_chunks",
    "pose_compat",
    "longrecipe_compat",
    "long_share",
    "rope_base",
    "data",
    "init",
]


def extension_settings(run_dirs) -> pd.DataFrame:
    """One row per `longctx pretrain` run directory: run and SETTINGS, from the
    experiment config recorded in its checkpoints/last.ckpt."""
    rows = []
    for label, experiment in recorded_configs(run_dirs, "data"):
        data = experiment["data"]
        transform = data.get("position_transform", "none")
        rows.append(
            {
                "run": label,
                "position_transform": transform,
                "window": int(data["window"]),
                "target_length": int(data.get("target_length") or experiment["model"]["max_position"]),
                "pose_chunks": (data.get("pose") or {}).get("chunks") if transform == "pose" else None,
                "pose_compat": (data.get("pose") or {}).get("compat") if transform == "pose" else None,
                "longrecipe_compat": (data.get("longrecipe") or {}).get("compat")
                if transform == "longrecipe"
                else None,
                "long_share": data.get("long_share", 0.0),
                "rope_base": experiment["model"]["rope_base"],
                "data": data.get("path") or ",".join(s["path"] for s in data.get("mixture") or []) or "embedded",
                "init": experiment.get("init"),
            }
        )
    return pd.DataFrame(rows, columns=["run", *SETTINGS])


def extension_table(
    settings: pd.DataFrame,
    fi: pd.DataFrame,
    snapshots: pd.DataFrame | None = None,
    effective: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per run: its recipe, tokens seen, pairs, the share of pairs at distance >=
    data.window, the largest trained distance, and the last / best NIAH effective length
    (`tables.effective_length_table`; NaN without probes)."""
    windows = dict(zip(settings["run"], settings["window"], strict=False))
    beyond = beyond_window_table(fi, windows, snapshots).rename(
        columns={"beyond": "pairs_beyond_window", "fraction_beyond": "share_beyond_window"}
    )
    tokens = fi.groupby("run", sort=False).apply(
        lambda rows: int(rows.loc[rows["step"] == rows["step"].max(), "tokens_seen"].iloc[0]), include_groups=False
    )
    beyond["tokens_seen"] = beyond["run"].map(tokens)
    last, best = {}, {}
    if effective is not None:
        for run, rows in effective.groupby("run", sort=False):
            rows = rows.sort_values("step")
            last[run], best[run] = float(rows["effective_length"].iloc[-1]), float(rows["effective_length"].max())
    beyond["effective_length"] = beyond["run"].map(lambda run: last.get(run, math.nan))
    beyond["best_effective_length"] = beyond["run"].map(lambda run: best.get(run, math.nan))
    table = settings[["run", "position_transform", "target_length"]].merge(beyond, on="run", how="right")
    return table[
        [
            "run",
            "position_transform",
            "window",
            "target_length",
            "tokens_seen",
            "pairs",
            "pairs_beyond_window",
            "share_beyond_window",
            "max_distance",
            "effective_length",
            "best_effective_length",
        ]
    ]


def markdown(table: pd.DataFrame) -> str:
    """A pipe table of the frame (floats to 3 significant digits; no tabulate dependency)."""

    def cell(value) -> str:
        if isinstance(value, float):
            return "nan" if math.isnan(value) else f"{value:.3g}"
        return str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)
