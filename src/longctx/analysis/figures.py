"""Plots of the STRING figures from the analysis frames (matplotlib, Agg canvas, no pyplot state).

    from longctx.analysis import figures
    fig = figures.plot_history(history, "train/loss", x="train/tokens_seen")     # loss curves
    fig = figures.plot_fi_growth(fi_growth(fi))                  # f at L/4, L/2, 3L/4 vs tokens
    fig = figures.plot_fi(fi)                                    # Fig. 3: f(i) of each run's last snapshot
    fig = figures.plot_fi(fi, window=512)                        # SkipAlign Fig. 2: the original window marked
    fig = figures.plot_pass_rate(frames.per_length, window=512)  # SkipAlign Fig. 3: NIAH within / beyond it
    fig = figures.plot_effective_length_vs_tokens(table)         # Fig. 2a
    fig = figures.plot_effective_length_vs_frequency(table)      # Fig. 2b
    fig = figures.plot_ablation(ablation_grid(results))          # Fig. 7: StRing W x S
    figures.save(fig, "runs/figures", "fig2a")                   # -> runs/figures/fig2a.png
    figures.figure1("data/embedded", 2048, "out/fig1.png")       # Fig. 1 (probes.dataset_fi.plot_figure1)
    figures.figure4("runs/niah/niah.json", "out/fig4.png")       # Fig. 4 (eval.effective_length.plot_heatmap)

Each `plot_*` function draws from a frame of `analysis.runs`, `analysis.fi`,
`analysis.niah_results` or `analysis.tables` and returns a `matplotlib.figure.Figure` on an Agg
canvas (so it works headless and leaves any pyplot backend alone); one line per run. Fig. 2
follows STRING §3: (a) effective length against consumed tokens, (b) effective length on
the x-axis against f at that length (log scale) — models whose curves align in (b) but not
in (a) reached the same length from the same position frequency. Figures 1 and 4 already
have plotting code next to their computations; `figure1` and `figure4` call it and return
the PNG path it writes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from longctx.analysis.runs import wide

POSITION_COLORS = {"L/4": "tab:blue", "L/2": "tab:orange", "3L/4": "tab:green", "L-1": "tab:red"}
LINE_STYLES = ["-", "--", ":", "-."]


def new_figure(width: float = 6.4, height: float = 4.2) -> tuple[Figure, Axes]:
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _no_data(axis, message: str) -> None:
    axis.text(0.5, 0.5, message, ha="center", va="center", transform=axis.transAxes, color="gray")


def _finish(figure: Figure, axis, title: str, legend: bool = True, grid: bool = True) -> Figure:
    axis.set_title(title)
    if legend and axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize="small")
    if grid:
        axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def save(figure: Figure, directory: str | Path, name: str, dpi: int = 120) -> Path:
    """Write `figure` as `<directory>/<name>.png` and return the path."""
    path = Path(directory) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path


def plot_history(
    history: pd.DataFrame, metric: str, x: str = "step", title: str | None = None, log_y: bool = False
) -> Figure:
    """`metric` against `x` (`step` or another metric, e.g. train/tokens_seen), one line per run."""
    figure, axis = new_figure()
    metrics = [metric] if x == "step" else [x, metric]
    table = wide(history, metrics).dropna(subset=metrics)
    for run, rows in table.groupby("run", sort=False):
        axis.plot(rows[x], rows[metric], marker="." if len(rows) < 50 else None, label=run)
    if table.empty:
        _no_data(axis, f"no {metric} logged")
    axis.set_xlabel("optimizer step" if x == "step" else x)
    axis.set_ylabel(metric)
    if log_y:
        axis.set_yscale("log")
    return _finish(figure, axis, title or metric)


def plot_fi_growth(growth: pd.DataFrame, title: str = "f(i) growth during training") -> Figure:
    """f at L/4, L/2, 3L/4 (colours) against tokens seen, one line style per run (log y)."""
    figure, axis = new_figure()
    for index, (run, rows) in enumerate(growth.groupby("run", sort=False)):
        for position, points in rows.groupby("position", sort=False):
            axis.plot(
                points["tokens_seen"],
                points["count"],
                LINE_STYLES[index % len(LINE_STYLES)],
                marker=".",
                color=POSITION_COLORS.get(position),
                label=f"{run}: f({position})",
            )
    _count_axes(axis, growth, "tokens seen", "trained pairs f(i)")
    return _finish(figure, axis, title)


def plot_fi(
    fi: pd.DataFrame,
    step: int | None = None,
    title: str = "position frequency f(i)",
    window: int | None = None,
    target: int | None = None,
) -> Figure:
    """f(i) against relative position i for each run's snapshot at `step` (default: its last), log y
    (STRING Figure 3: the same tokens at different training lengths). `window`: a dashed vertical
    line at the original training window (SkipAlign Figure 2: SFT pairs beyond it come from skips);
    `target`: a dotted one at the target length of context extension (PoSE, RandPos, LongRecipe)."""
    figure, axis = new_figure()
    for run, rows in fi.groupby("run", sort=False):
        at = rows["step"].max() if step is None else step
        curve = rows[rows["step"] == at]
        axis.plot(curve["distance"], curve["count"], label=f"{run} (step {at})")
    _count_axes(axis, fi, "relative position i", "f(i)")
    _mark_window(axis, window)
    if target:
        axis.axvline(target, color="black", linestyle=":", linewidth=1, label=f"target length ({target})")
    return _finish(figure, axis, title)


def _mark_window(axis, window: int | None) -> None:
    if window:
        axis.axvline(window, color="gray", linestyle="--", linewidth=1, label=f"original window ({window})")


def plot_pass_rate(
    per_length: pd.DataFrame, window: int | None = None, title: str = "NIAH pass rate by length"
) -> Figure:
    """NIAH pass rate (Wilson interval shaded) against context length, one line per run, from
    `niah.load_niah(...).per_length`; `window` marks the original window (SkipAlign Figure 3:
    retrieval within and beyond it)."""
    figure, axis = new_figure()
    for run, rows in per_length.groupby("run", sort=False):
        rows = rows.sort_values("length")
        (line,) = axis.plot(rows["length"], rows["rate"], marker="o", label=run)
        axis.fill_between(rows["length"], rows["wilson_low"], rows["wilson_high"], color=line.get_color(), alpha=0.15)
    if per_length.empty:
        _no_data(axis, "no NIAH result")
    _mark_window(axis, window)
    axis.set_ylim(-0.05, 1.05)
    axis.set_xlabel("context length (tokens)")
    axis.set_ylabel("pass rate")
    return _finish(figure, axis, title)


def _count_axes(axis, frame: pd.DataFrame, xlabel: str, ylabel: str) -> None:
    """Labels, and a log y axis for pair counts (or a note when there is no snapshot)."""
    if frame.empty:
        _no_data(axis, "no f(i) snapshot")
    elif (frame["count"] > 0).any():
        axis.set_yscale("log")
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)


def plot_effective_length_vs_tokens(
    table: pd.DataFrame, title: str = "Fig. 2a: effective length vs consumed tokens"
) -> Figure:
    """STRING Figure 2a from `tables.effective_length_table`: one line per run."""
    figure, axis = new_figure()
    for run, rows in table.groupby("run", sort=False):
        axis.plot(rows["tokens_seen"], rows["effective_length"], marker="o", label=run)
    if table.empty:
        _no_data(axis, "no NIAH probe logged (probe.niah_every_steps)")
    axis.set_ylim(bottom=0)
    axis.set_xlabel("tokens seen")
    axis.set_ylabel("effective context length (tokens)")
    return _finish(figure, axis, title)


def plot_effective_length_vs_frequency(
    table: pd.DataFrame, title: str = "Fig. 2b: effective length vs position frequency"
) -> Figure:
    """STRING Figure 2b: effective length L_eff (x) against f(L_eff - 1), the trained pairs at
    that relative position (y, log), one line per run; probes with L_eff = 0 have no f."""
    figure, axis = new_figure()
    points = table.dropna(subset=["f_at_effective_length"])
    points = points[points["effective_length"] > 0]
    for run, rows in points.groupby("run", sort=False):
        axis.plot(rows["effective_length"], rows["f_at_effective_length"], marker="o", label=run)
    if points.empty:
        _no_data(axis, "no probe with a positive effective length and its f")
    elif (points["f_at_effective_length"] > 0).all():
        axis.set_yscale("log")
    axis.set_xlabel("effective context length L_eff (tokens)")
    axis.set_ylabel("f(L_eff): trained pairs at that position")
    return _finish(figure, axis, title)


def plot_ablation(
    grid: pd.DataFrame,
    title: str = "Fig. 7: StRing local window W x shift S",
    value_label: str = "effective length",
    vmax: float | None = None,
) -> Figure:
    """STRING Figure 7 as a heatmap of `tables.ablation_grid`: rows = W, columns = S, cells
    annotated; colours from 0 to `vmax` (default: the largest cell, 1 for an all-zero grid)."""
    figure, axis = new_figure(max(4.5, 1.1 * grid.shape[1] + 2.5), max(3.5, 0.6 * grid.shape[0] + 2))
    values = grid.to_numpy(dtype=float)
    if values.size:
        top = vmax if vmax is not None else (np.nanmax(values) if np.isfinite(values).any() else 0.0)
        image = axis.imshow(np.ma.masked_invalid(values), cmap="viridis", aspect="auto", vmin=0, vmax=top or 1.0)
        figure.colorbar(image, ax=axis, label=value_label)
        for (i, j), value in np.ndenumerate(values):
            if not np.isnan(value):
                axis.text(j, i, f"{value:.3g}", ha="center", va="center", color="white", fontsize="small")
    else:
        _no_data(axis, "no StRing evaluation")
    axis.set_xticks(range(grid.shape[1]), [f"{c:g}" if isinstance(c, float) else str(c) for c in grid.columns])
    axis.set_yticks(range(grid.shape[0]), [str(r) for r in grid.index])
    axis.set_xlabel(f"shift S ({grid.columns.name})" if grid.columns.name else "shift S")
    axis.set_ylabel(f"local window W ({grid.index.name})" if grid.index.name else "local window W")
    return _finish(figure, axis, title, legend=False, grid=False)


def figure1(source, window: int, path: str | Path, tokenizer: str = "bpe-8192") -> Path:
    """STRING Figure 1 for a dataset (a prepared directory, a corpus source, or an array of
    document lengths) through `probes.dataset_fi`; returns the PNG path."""
    from longctx.probes.dataset_fi import document_lengths, figure1_frequencies, plot_figure1

    lengths = source if isinstance(source, np.ndarray) else document_lengths(str(source), tokenizer)
    return plot_figure1(figure1_frequencies(lengths, window), path)


def figure4(result, path: str | Path, title: str | None = None) -> Path:
    """STRING Figure 4 (depth x length recall) of an EffectiveLengthResult or a niah.json
    through `eval.effective_length.plot_heatmap`; returns the PNG path."""
    from longctx.analysis.niah_results import niah_result
    from longctx.eval.effective_length import EffectiveLengthResult, plot_heatmap

    if not isinstance(result, EffectiveLengthResult):
        result = niah_result(result)
    return plot_heatmap(result, path, title=title)
