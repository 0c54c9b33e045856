"""Inverse-frequency loss weights by in-document position (`train.loss_weighting`).

STRING (§2.2) traces the short effective length to the rarely trained tail of the position
frequency. EXACT (arXiv 2605.10544, 2026) upweights long-context targets in packed,
document-masked continued pretraining by inverse frequency; here the weight of a labelled
token depends on its position id p (its index in its document, as the f(i) probe's
absolute-position counts see it, probes/position_frequency.py):

    n(p)   = labelled tokens at position id p over the rows the run trains on
    n_mean = sum_p n(p) / #{p : n(p) > 0}
    w(p)   = min(cap, n_mean / n(p))          (w = cap where n(p) = 0: never used)

and one optimizer step minimises sum_t w(p_t) CE_t / sum_t w(p_t) over its labelled tokens
(the weights normalised to mean 1 over the step; train/module.py divides by the summed
weight where the plain loss divides by the token count).

The counts come from one pass over the run's rows before step 0 (`train.max_steps` x
rows per step of the global stream, with the run's position transform) and are frozen:
they depend only on the config, so every rank and a resumed run compute the same weights.
<out_dir>/loss_weights.json records them.

    longctx pretrain experiments/replicate/cpu_base.yaml train.loss_weighting=inverse_frequency
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path

import torch

from longctx.probes.position_frequency import absolute_position_counts

WEIGHTS_FILE = "loss_weights.json"


def inverse_frequency_weights(counts: torch.Tensor, cap: float) -> torch.Tensor:
    """w(p) = min(cap, n_mean / n(p)) for counts n [positions] (int); float32 [positions]."""
    counts = counts.double()
    seen = counts > 0
    if not seen.any():
        return torch.ones_like(counts, dtype=torch.float32)
    mean = counts.sum() / seen.sum()
    weights = torch.where(seen, mean / counts.clamp(min=1), torch.full_like(counts, cap))
    return weights.clamp(max=cap).float()


def position_label_counts(rows: Iterable[dict[str, torch.Tensor]], max_position: int) -> torch.Tensor:
    """n(p): labelled tokens at each position id in [0, max_position) over `rows` (contract
    rows, [window] each); a position id >= max_position is an error, not a silent bin."""
    total = torch.zeros(max_position, dtype=torch.int64)
    for row in rows:
        histogram = absolute_position_counts(row["position_ids"][None], max_position, row["labels"][None])
        if histogram.overflow:
            raise ValueError(f"a labelled token's position id is >= {max_position}: widen the count")
        total += histogram.counts
    return total


def run_loss_weights(
    rows: Iterable[dict[str, torch.Tensor]], count: int, max_position: int, cap: float, out_dir: Path | None
) -> torch.Tensor:
    """The frozen weights of a run from its first `count` global rows; written to `out_dir`
    (None: not written, as on ranks other than 0)."""
    counts = position_label_counts(itertools.islice(rows, count), max_position)
    weights = inverse_frequency_weights(counts, cap)
    if out_dir is None:
        return weights
    out_dir.mkdir(parents=True, exist_ok=True)
    body = {"rows": count, "cap": cap, "counts": counts.tolist(), "weights": weights.tolist()}
    (out_dir / WEIGHTS_FILE).write_text(json.dumps(body) + "\n")
    return weights
