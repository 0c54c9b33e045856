"""Effective context length: the search over lengths (STRING §3 "Evaluation", Figure 4; docs/design.md §7.2).

This module owns the search and its report. For lengths L = step, 2 step, ... <= max_length
(step 128 in the paper) a task (the 4-needle NIAH by default, eval/niah/) gives
`tests_per_length` prompts of exactly L tokens, the engine decodes them greedily and the
task scores each (NIAH: passed when >= `min_found` answers, 2 of 4 needles, appear in the
output); the search stops after the first length whose pass rate (a task with fractional
scores: its mean score) is below `pass_threshold` (0.5). The effective length is the last length before
it (0 when the first length fails; the largest tested length when none fails). Lengths
too short for the prompt's fixed part are skipped and listed (`skipped_lengths`): with
bpe-8192, which spells a 6-digit number in 6 tokens, `paper` needs 125 tokens,
`string-repo` 129 (so it starts at 256 with the paper's step of 128), the RULER tasks
172-215 and `helmet-json-kv` 135.

Each pass rate p = k / n comes with its Wilson score 95% interval (eval/stats.py; at the
paper's n = 500 a rate of 0.5 is known to +-0.044, at n = 50 to +-0.13).

Every answer's needle depth (its position as a fraction of the haystack) falls into one
of `depth_bands` equal bands; recall per band and per (band, length) cell is the depth x
length heatmap of Figure 4 (`plot_heatmap`), recall per band over all lengths the depth
profile of Table 4.

Each length is a cell of the evaluation engine (eval/cells.py): its tests are the task's
samples for (seed, length, index), decoded greedily by `model.inference.generation.generate` (each
row stops at the tokenizer's EOS or after `max_new_tokens`) and scored by the task, written
as they finish and resumed after a kill. The search is a driver over those cells
(`search_effective_length` takes the function that runs the cell of a length), so tests can
hand it oracle cells.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from longctx.config import NiahConfig
from longctx.eval.errors import PromptTooShortError
from longctx.eval.stats import wilson_interval

if TYPE_CHECKING:
    from longctx.eval.cells import CellResult


@dataclass
class LengthResult:
    length: int
    tests: int
    passed: int
    rate: float
    wilson_low: float
    wilson_high: float
    recall: float
    """Fraction of all answers found (the authors' per-test score, averaged)."""
    example_output: str
    """Decoded output of the first test, for eyeballing."""
    seconds: float = 0.0
    """Wall time of this length: building, decoding and scoring its tests."""


@dataclass
class EffectiveLengthResult:
    effective_length: int
    per_length: list[LengthResult]
    depth_edges: list[float]
    """depth_bands + 1 band edges in [0, 1]."""
    depth_recall: list[float]
    """Recall per depth band over all tested lengths (NaN where no answer fell)."""
    heatmap: np.ndarray
    """[depth_bands, tested lengths] recall (NaN where no answer fell)."""
    skipped_lengths: list[int] = field(default_factory=list)
    """Lengths below the prompt overhead (not tested)."""
    config: NiahConfig = field(default_factory=NiahConfig)

    @property
    def lengths(self) -> list[int]:
        return [row.length for row in self.per_length]

    def to_dict(self) -> dict:
        """Plain lists and numbers (NaN -> None), for JSON and W&B."""

        def clean(values):
            return [None if isinstance(v, float) and math.isnan(v) else v for v in values]

        return {
            "effective_length": self.effective_length,
            "per_length": [dataclasses.asdict(row) for row in self.per_length],
            "depth_edges": self.depth_edges,
            "depth_recall": clean(self.depth_recall),
            "heatmap": [clean(row) for row in self.heatmap.tolist()],
            "lengths": self.lengths,
            "skipped_lengths": self.skipped_lengths,
            "config": dataclasses.asdict(self.config),
        }

    @classmethod
    def from_dict(cls, data: dict) -> EffectiveLengthResult:
        """The inverse of `to_dict` (None -> NaN; derived `lengths` and unknown keys ignored).
        Raises KeyError/TypeError/ValueError on an incomplete dict."""
        fields = {f.name for f in dataclasses.fields(LengthResult)}

        def nan(values):
            return [math.nan if v is None else v for v in values]

        return cls(
            effective_length=int(data["effective_length"]),
            per_length=[LengthResult(**{k: v for k, v in row.items() if k in fields}) for row in data["per_length"]],
            depth_edges=list(data["depth_edges"]),
            depth_recall=nan(data["depth_recall"]),
            heatmap=np.array([nan(row) for row in data["heatmap"]], dtype=float),
            skipped_lengths=list(data.get("skipped_lengths", [])),
            config=_config_from_dict(data["config"]),
        )


def _config_from_dict(values: dict) -> NiahConfig:
    """The settings stored in a niah.json; files written before `lengths` was a setting
    call it `fixed_lengths`."""
    values = dict(values)
    if "fixed_lengths" in values:
        values["lengths"] = list(values.pop("fixed_lengths"))
    known = {f.name for f in dataclasses.fields(NiahConfig)}
    return NiahConfig(**{key: value for key, value in values.items() if key in known})


def length_result(result: CellResult) -> tuple[LengthResult, np.ndarray, np.ndarray]:
    """A length's row from its cell, plus every answer's depth and whether it was found
    (empty for a task whose records carry no depths)."""
    records, summary = result.records, result.summary
    count = summary["count"]
    passed = summary.get("passed", round(summary["score"] * count))
    low, high = summary.get("wilson", wilson_interval(passed, count))
    depths, hits = answer_depths(records)
    recall = float(hits.mean()) if len(hits) else float(summary["score"])
    row = LengthResult(
        result.cell.length,
        count,
        passed,
        float(summary["score"]),
        low,
        high,
        recall,
        records[0].get("text") or "",
        summary.get("seconds", 0.0),
    )
    return row, depths, hits


def answer_depths(records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Every answer's needle depth and whether it was found, over a cell's records (empty for
    a task whose records carry no depths)."""
    depths = np.array([depth for record in records for depth in record.get("depths", [])], dtype=float)
    hits = np.array([hit for record in records for hit in record.get("found", [])], dtype=bool)
    return depths, hits


def band_recall(depths: np.ndarray, hits: np.ndarray, num_bands: int) -> np.ndarray:
    """Recall per depth band, of `num_bands` equal bands of [0, 1] (depth 1 in the last; NaN
    where no answer fell)."""
    bands = np.minimum((depths * num_bands).astype(np.int64), num_bands - 1)
    totals = np.bincount(bands, minlength=num_bands)
    found = np.bincount(bands, weights=hits, minlength=num_bands)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, found / totals, np.nan)


def search_effective_length(run_length: Callable[[int], CellResult], config: NiahConfig) -> EffectiveLengthResult:
    """Run the search of the module docstring over `run_length(length)`, the finished cell of
    one length (PromptTooShortError: the length is skipped). `config.max_length` must be
    resolved (`NiahConfig.for_model`) unless `lengths` are given."""
    rows: list[LengthResult] = []
    band_columns, all_depths, all_hits, skipped = [], [], [], []
    effective, failed = 0, False
    for length in config.evaluated_lengths():
        try:
            row, depths, hits = length_result(run_length(length))
        except PromptTooShortError:
            skipped.append(length)
            continue
        rows.append(row)
        band_columns.append(band_recall(depths, hits, config.depth_bands))
        all_depths.append(depths)
        all_hits.append(hits)
        if row.rate < config.pass_threshold:
            failed = True
            if config.searches:
                break
        elif not failed:
            effective = length
    if not rows:
        raise PromptTooShortError(
            f"every length up to max_length={config.max_length} is below the overhead of task {config.task!r}"
        )
    depth_recall = band_recall(np.concatenate(all_depths), np.concatenate(all_hits), config.depth_bands)
    return EffectiveLengthResult(
        effective_length=effective,
        per_length=rows,
        depth_edges=np.linspace(0, 1, config.depth_bands + 1).tolist(),
        depth_recall=depth_recall.tolist(),
        heatmap=np.stack(band_columns, axis=1),
        skipped_lengths=skipped,
        config=config,
    )


def plot_heatmap(result: EffectiveLengthResult, path: str | Path, title: str | None = None) -> Path:
    """The depth x length recall grid (STRING Figure 4) as a PNG: depth 0 at the top, red = missed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    bands = len(result.depth_edges) - 1
    fig = Figure(figsize=(max(4.0, 0.5 * len(result.lengths) + 2), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(result.heatmap), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(result.lengths)), [str(length) for length in result.lengths], rotation=45)
    ax.set_yticks(
        range(bands),
        [f"{100 * a:.0f}-{100 * b:.0f}%" for a, b in zip(result.depth_edges[:-1], result.depth_edges[1:], strict=True)],
    )
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(title or f"{result.config.task}: effective length {result.effective_length}")
    fig.colorbar(image, ax=ax, label="needle recall")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
