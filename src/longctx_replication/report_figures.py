"""Figures of the seed-level replication report: STRING Fig. 2a, 2b and 4 with every seed drawn.

    fig2a.png      effective length vs tokens consumed, one colour per window, one line per seed
    fig2b.png      effective length vs f(effective length) (log scale), the same lines
    fig4_w<L>.png  the largest window's depth x length recall at its last probe, averaged
                   over seeds (lengths a seed did not test are left blank)

Each figure shows the runs themselves rather than a pooled curve, so a reader sees the
seed-to-seed spread the verdicts' intervals summarise.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from longctx.analysis.figures import new_figure, save
from longctx_replication.seed_verdicts import Probe


def _curves(run_probes: dict[tuple[int, int], list[tuple[Probe, dict]]], x: str, path: Path, xlabel: str) -> Path:
    figure, axis = new_figure()
    windows = sorted({w for _, w in run_probes})
    colours = {w: f"C{i}" for i, w in enumerate(windows)}
    for (seed, window), probes in sorted(run_probes.items()):
        points = [(getattr(p, x), p.effective_length) for p, _ in probes if getattr(p, x) > 0]
        if points:
            xs, ys = zip(*points, strict=True)
            label = f"L={window}" if seed == min(s for s, w in run_probes if w == window) else None
            axis.plot(xs, ys, marker="o", color=colours[window], alpha=0.6, label=label)
    axis.set_xscale("log" if x == "f_at_effective_length" else "linear")
    axis.set_xlabel(xlabel)
    axis.set_ylabel("effective length (NIAH)")
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[1]:
        axis.legend()
    return save(figure, path.parent, path.stem)


def mean_heatmap(results: list[dict]) -> tuple[np.ndarray, list[int]]:
    """[bands, lengths] mean recall over the niah.json `results`, on the union of their lengths."""
    lengths = sorted({int(length) for r in results for length in r["lengths"]})
    bands = len(results[0]["depth_edges"]) - 1
    stack = np.full((len(results), bands, len(lengths)), np.nan)
    for k, result in enumerate(results):
        for j, length in enumerate(result["lengths"]):
            column = [np.nan if v is None else v for v in (row[j] for row in result["heatmap"])]
            stack[k, :, lengths.index(int(length))] = column
    with np.errstate(invalid="ignore"):
        counts = np.sum(~np.isnan(stack), axis=0)
        mean = np.where(counts > 0, np.nansum(stack, axis=0) / np.maximum(counts, 1), np.nan)
    return mean, lengths


def draw_all(run_probes: dict[tuple[int, int], list[tuple[Probe, dict]]], largest: int, directory: Path) -> list[Path]:
    """The three figures into `directory`; returns their paths (fig4 only when probes exist)."""
    paths = [
        _curves(run_probes, "tokens", directory / "fig2a.png", "tokens consumed"),
        _curves(run_probes, "f_at_effective_length", directory / "fig2b.png", "f(effective length)"),
    ]
    last = [probes[-1][1] for (_, w), probes in sorted(run_probes.items()) if w == largest and probes]
    if last:
        mean, lengths = mean_heatmap(last)
        figure, axis = new_figure()
        image = axis.imshow(np.ma.masked_invalid(mean), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        edges = last[0]["depth_edges"]
        axis.set_yticks(range(len(edges) - 1), [f"{100 * a:.0f}-{100 * b:.0f}%" for a, b in itertools.pairwise(edges)])
        axis.set_xticks(range(len(lengths)), [str(length) for length in lengths])
        axis.set_xlabel("context length")
        axis.set_ylabel("needle depth")
        axis.set_title(f"L={largest}: recall at the last probe, mean of {len(last)} seeds")
        figure.colorbar(image, ax=axis)
        paths.append(save(figure, directory, f"fig4_w{largest}"))
    return paths
