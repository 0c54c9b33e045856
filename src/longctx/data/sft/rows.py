"""Rows of the batch contract for the three SFT variants (SkipAlign §3.2-§4, docs/design.md §9).

Rows hold `window` tokens; a pad token has label IGNORE_INDEX and belongs to its own
trailing document (positions 0, 1, ...), so it never attends to a real token:

- `normal` (Normal-SFT): one sample per row, ids 0..n-1; with `pack=True` whole samples
  are laid into rows greedily in a seeded order, one document each (document mask, ids
  reset per document).
- `packed` (PackedSFT-k, LongChat): all samples concatenated in a seeded order and cut into
  rows of k = window tokens; one document per row (samples attend across each other), ids
  0..k-1. A sample cut by a row boundary goes on in the next row; the last token of a row
  is labelled with the first token of the next one when that is a response token, so every
  response token of every sample is predicted exactly once.
- `skipalign`: like `normal` (one sample per row, or `pack=True`), with the ids of
  `positions.skipalign_position_ids` (strategy all | inner | outer, extended length L,
  probability p, p_scope), drawn from `np.random.default_rng([seed, 1, sample index])`:
  a sample's ids do not depend on the packing or on the other samples. They are drawn
  once, as the paper's pre-processing does (§4): every epoch sees the same skips.

`pack` applies to normal and skipalign; PackedSFT-k rows are always full. The share of
trained pairs beyond the window per variant is in docs/sft.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from longctx.batch import IGNORE_INDEX
from longctx.data.positions import P_SCOPES, STRATEGIES, check_choice, check_probability, skipalign_position_ids
from longctx.data.sft.template import ChatSample

VARIANTS = ("normal", "packed", "skipalign")
_ORDER_STREAM, _POSITION_STREAM = 0, 1
"""Second seed word of the two random streams of SFTRows (sample order, SkipAlign ids)."""


class SFTRows(torch.utils.data.Dataset):
    """Contract rows of `window` tokens of one SFT variant (see the module docstring).

    Map-style: item i is a dict of [window] tensors (input_ids, labels, position_ids,
    document_ids); a DataLoader stacks them into [B, window] and may shuffle them.
    `position_limit` bounds every position id from above (exclusive): the longest sample
    for normal, window for packed, extended_length for skipalign; the model's RoPE range
    (`model.max_position`) must reach it.
    """

    def __init__(
        self,
        samples: Sequence[ChatSample],
        *,
        variant: str,
        window: int,
        pad_id: int,
        seed: int = 0,
        pack: bool = False,
        strategy: str = "outer",
        extended_length: int = 100_000,
        p: float = 0.5,
        p_scope: str = "boundary",
    ):
        check_choice("variant", variant, VARIANTS)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        if not samples:
            raise ValueError("samples is empty")
        if variant == "skipalign":
            check_choice("strategy", strategy, STRATEGIES)
            check_choice("p_scope", p_scope, P_SCOPES)
            check_probability(p)
        self.samples, self.variant, self.window, self.pad_id, self.seed = samples, variant, window, pad_id, seed
        self.strategy, self.extended_length, self.p, self.p_scope = strategy, extended_length, p, p_scope
        order = np.random.default_rng([seed, _ORDER_STREAM]).permutation(len(samples))
        longest = max(len(sample) for sample in samples)
        if variant == "packed":
            self._stream = np.concatenate([samples[i].input_ids for i in order])
            self._stream_labels = np.concatenate([samples[i].labels for i in order])
            self.position_limit = window
            return
        if longest > window:
            index = max(range(len(samples)), key=lambda i: len(samples[i]))
            raise ValueError(
                f"sample {index} has {longest} tokens but window is {window}: "
                f"set max_sample_length <= window for the {variant} variant"
            )
        if variant == "skipalign" and longest > extended_length:
            raise ValueError(f"extended_length={extended_length} is shorter than the longest sample ({longest} tokens)")
        if pack:
            self._plan = _next_fit([len(samples[i]) for i in order], order, window)
        else:
            self._plan = [[i] for i in range(len(samples))]
        self.position_limit = extended_length if variant == "skipalign" else longest

    def __len__(self) -> int:
        if self.variant == "packed":
            return math.ceil(len(self._stream) / self.window)
        return len(self._plan)

    def position_ids(self, sample_index: int) -> np.ndarray:
        """int64 [n]: the ids sample `sample_index` is trained with (normal and skipalign)."""
        sample = self.samples[sample_index]
        if self.variant == "normal":
            return np.arange(len(sample), dtype=np.int64)
        rng = np.random.default_rng([self.seed, _POSITION_STREAM, sample_index])
        return skipalign_position_ids(
            sample.block_lengths, sample.roles, self.extended_length, self.strategy, self.p, rng, self.p_scope
        )

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is outside the {len(self)} rows")
        row = {
            "input_ids": np.full(self.window, self.pad_id, dtype=np.int64),
            "labels": np.full(self.window, IGNORE_INDEX, dtype=np.int64),
            "position_ids": np.zeros(self.window, dtype=np.int64),
            "document_ids": np.zeros(self.window, dtype=np.int64),
        }
        if self.variant == "packed":
            start = index * self.window
            used = min(self.window, len(self._stream) - start)
            row["input_ids"][:used] = self._stream[start : start + used]
            row["labels"][:used] = self._stream_labels[start : start + used]
            row["position_ids"][:used] = np.arange(used)
            documents = 1
        else:
            used = 0
            for document, sample_index in enumerate(self._plan[index]):
                sample = self.samples[sample_index]
                span = slice(used, used + len(sample))
                row["input_ids"][span] = sample.input_ids
                row["labels"][span] = sample.labels
                row["position_ids"][span] = self.position_ids(sample_index)
                row["document_ids"][span] = document
                used += len(sample)
            documents = len(self._plan[index])
        row["position_ids"][used:] = np.arange(self.window - used)
        row["document_ids"][used:] = documents
        return {key: torch.from_numpy(value) for key, value in row.items()}


def _next_fit(lengths: Sequence[int], order: Sequence[int] | np.ndarray, window: int) -> list[list[int]]:
    """Sample indices `order` (of these lengths) laid into rows of `window` tokens in order."""
    rows: list[list[int]] = []
    room = 0
    for length, index in zip(lengths, order, strict=True):
        if length > room:
            rows.append([])
            room = window
        rows[-1].append(int(index))
        room -= length
    return rows
