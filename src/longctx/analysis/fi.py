"""The f(i) snapshots of training runs as tidy pandas frames (STRING §2.2 Eq. 2, docs/design.md §7.1).

    from longctx.analysis.fi import load_fi, fi_snapshots, fi_growth
    fi = load_fi("runs/tiny_1k")          # run, step, tokens_seen, distance, count
    fi_snapshots(["runs/a", "runs/b"])    # one row per snapshot: totals and overflow
    fi_growth(fi)                         # f at L/4, L/2, 3L/4, L-1 per snapshot (vs tokens)

At every checkpoint the f(i) callback (train/callbacks/frequency.py) writes the global
counts to `<run>/fi/fi-step-NNNNNNN.npz`: `relative[d]` = f(d), the number of trained
(query, key) pairs at relative position d = position_ids[q] - position_ids[k] for
d < L (the training window), `overflow` = pairs at d >= L, `absolute[p]` = tokens at
position id p, and `tokens_seen` = every token of every batch so far (STRING Figure 2a's
"consumed tokens"). This module reads them back exactly (int64 counts; the frame's `count`
column sums to `relative.sum()`), one row per (snapshot, distance).

`fi_growth` takes f at the distances the callback logs as `fi/f@...` scalars, with
L = the number of bins: f(L // 4), f(L // 2), f(3L // 4), f(L - 1) — how fast the rare
long distances accumulate compared to the short ones (STRING §3, Findings 2-3).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from longctx.analysis.runs import Sources, label_sources
from longctx.probes.position_frequency import SUMMARY_POSITIONS

SNAPSHOT = re.compile(r"^fi-step-(\d+)\.npz$")
REQUIRED = ("relative", "overflow", "tokens_seen")


def snapshot_files(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of a run's f(i) snapshots, by step. Errors name the directory at fault."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir} does not exist")
    files = sorted(
        (int(match.group(1)), path)
        for path in (run_dir / "fi").glob("fi-step-*.npz")
        if (match := SNAPSHOT.match(path.name))
    )
    if not files:
        raise FileNotFoundError(f"{run_dir} has no f(i) snapshot (fi/fi-step-NNNNNNN.npz; probe.fi must be on)")
    return files


def read_snapshot(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of one snapshot; a clear error naming the file when it is not one."""
    path = Path(path)
    try:
        with np.load(path) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise ValueError(f"{path} is not a readable f(i) snapshot (.npz): {error}") from None
    missing = [key for key in REQUIRED if key not in arrays]
    if missing:
        raise ValueError(f"{path} lacks {missing}: not an f(i) snapshot (has {sorted(arrays)})")
    if arrays["relative"].ndim != 1 or arrays["relative"].size == 0:
        raise ValueError(f"{path}: 'relative' must be a non-empty 1-D array, got shape {arrays['relative'].shape}")
    return arrays


def load_fi(sources: Sources, *, histogram: str = "relative") -> pd.DataFrame:
    """Columns run, step, tokens_seen, distance, count: every bin of every snapshot.

    `histogram="absolute"` reads the absolute-position histogram instead (then `distance`
    is the position id)."""
    if histogram not in ("relative", "absolute"):
        raise ValueError(f"histogram must be relative or absolute, got {histogram!r}")
    frames = []
    for label, run_dir in label_sources(sources).items():
        for step, path in snapshot_files(run_dir):
            arrays = read_snapshot(path)
            if histogram not in arrays:
                raise ValueError(f"{path} lacks {histogram!r}")
            counts = arrays[histogram].astype(np.int64)
            frames.append(
                pd.DataFrame(
                    {
                        "run": label,
                        "step": np.int64(step),
                        "tokens_seen": np.int64(arrays["tokens_seen"]),
                        "distance": np.arange(counts.size, dtype=np.int64),
                        "count": counts,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True).astype({"run": str})


def fi_snapshots(sources: Sources) -> pd.DataFrame:
    """One row per snapshot: run, step, tokens_seen, window (bins), pairs (sum of f),
    overflow (pairs at d >= window), count_only_labeled, path."""
    rows = []
    for label, run_dir in label_sources(sources).items():
        for step, path in snapshot_files(run_dir):
            arrays = read_snapshot(path)
            rows.append(
                {
                    "run": label,
                    "step": step,
                    "tokens_seen": int(arrays["tokens_seen"]),
                    "window": int(arrays["relative"].size),
                    "pairs": int(arrays["relative"].sum()),
                    "overflow": int(arrays["overflow"]),
                    "count_only_labeled": bool(arrays.get("count_only_labeled", True)),
                    "path": str(path),
                }
            )
    return pd.DataFrame(rows).astype({"run": str})


def fi_growth(fi: pd.DataFrame, positions: tuple[str, ...] = ("L/4", "L/2", "3L/4")) -> pd.DataFrame:
    """Columns run, step, tokens_seen, position (label), distance, count: f at the
    `positions` (keys of SUMMARY_POSITIONS) of each snapshot, L = that run's bin count."""
    unknown = [p for p in positions if p not in SUMMARY_POSITIONS]
    if unknown:
        raise ValueError(f"unknown positions {unknown}; choose from {list(SUMMARY_POSITIONS)}")
    windows = fi.groupby(["run", "step"])["distance"].max() + 1
    rows = []
    for (run, step), window in windows.items():
        for label in positions:
            rows.append((run, step, label, SUMMARY_POSITIONS[label](int(window))))
    wanted = pd.DataFrame(rows, columns=["run", "step", "position", "distance"])
    growth = wanted.merge(fi, on=["run", "step", "distance"], how="left")
    return growth[["run", "step", "tokens_seen", "position", "distance", "count"]]


def f_at(fi: pd.DataFrame, run: str, step: int, distance: int) -> float:
    """f(distance) of one snapshot; NaN when the snapshot or the bin does not exist."""
    match = fi[(fi["run"] == run) & (fi["step"] == step) & (fi["distance"] == distance)]
    return float(match["count"].iloc[0]) if len(match) else float("nan")
