"""f(i) of a sliding layer: the relative positions trained by a layer that sees only the
last W keys (docs/design.md §5 and §7.1).

A sliding layer of window W attends key k from query q only when they are in one document,
k is not after q and fewer than W tokens back (q - k < W, token distance). It trains

    f_W(d) = #{(q, k): same document, 0 <= q - k < W, labels[q] != -100,
               d = position_ids[q] - position_ids[k]}

so no distance at or beyond W (for consecutive ids) ever gets a gradient on those layers;
STRING's long distances are carried by the full layers alone, whose f is the plain f(d)
(probes/position_frequency.py). With ids that skip (SkipAlign, PoSE, LongRecipe) a
token distance below W can be a position distance far beyond it, which is exactly what
these counts record.

Counting: when every document's ids are consecutive, f_W is f truncated below W (a pair's
position distance is its token distance); otherwise one vectorised pass per token offset
0..W-1 over the batch, O(W x B x T).
"""

from __future__ import annotations

import torch

from longctx.batch import IGNORE_INDEX, document_start_mask


def windowed_position_counts(
    position_ids: torch.Tensor,
    document_ids: torch.Tensor,
    max_distance: int,
    window: int,
    labels: torch.Tensor | None = None,
    full: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(f_W(d) for d in [0, max_distance), pairs at d >= max_distance) over a [B, T] batch
    (see the module docstring). `full`: this batch's plain f(d) (the same labels and
    max_distance), which the consecutive-ids case truncates instead of counting."""
    if window <= 0:
        raise ValueError(f"window must be > 0, got {window}")
    position_ids, document_ids = position_ids.cpu().long(), document_ids.cpu()
    starts = document_start_mask(document_ids)
    run = starts.long().cumsum(1)  # the document (maximal run) of each token within its row
    queries = torch.ones_like(starts) if labels is None else labels.cpu() != IGNORE_INDEX
    steps = position_ids[:, 1:] - position_ids[:, :-1]
    if full is not None and window <= max_distance and bool(((steps == 1) | starts[:, 1:]).all()):
        counts = full.clone()
        counts[window:] = 0  # token distance = position distance: nothing at d >= W
        return counts, torch.zeros((), dtype=torch.long)
    counts = torch.zeros(max_distance + 1, dtype=torch.long)
    length = position_ids.shape[1]
    for offset in range(min(window, length)):
        query, key = slice(offset, length), slice(0, length - offset)
        valid = (run[:, query] == run[:, key]) & queries[:, query]
        distance = (position_ids[:, query] - position_ids[:, key])[valid].clamp(max=max_distance)
        counts += torch.bincount(distance, minlength=max_distance + 1)
    return counts[:max_distance], counts[max_distance]
