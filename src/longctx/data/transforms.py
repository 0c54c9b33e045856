"""Context-extension position transforms applied to packed rows (`data.position_transform`).

PoSE, RandPos and LongRecipe extend a model's window to a target length L_t by training on
rows of the usual window L_c whose position ids are spread over [0, L_t) (docs/design.md §9,
LongRecipe §4.2). The transform belongs to the data pipeline, never to the model: a row
leaves `PackedRows` with its `position_ids` rewritten and everything else of the batch
contract (input_ids, labels, document_ids) untouched, so attention, doc masking and the f(i)
probe see exactly what was trained.

Per row, each document (maximal run of equal `document_ids`: a whole row when
`data.doc_mask=false`) of n tokens gets the ids of its method from data/positions.py,
with L_c = n and its own generator

    rng = np.random.default_rng([data.seed, RNG_TAG, global row index, document index in row])

so a row's ids depend only on the seed and the row's global index: a resumed run, a run on
another number of ranks (rank r of W takes rows r, r + W, ...) and the uninterrupted run
draw identical ids. LongRecipe splits each document into sentences at tokens whose text
holds a delimiter (data/sentences.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from longctx.batch import document_start_mask
from longctx.data.positions import (
    longrecipe_position_ids,
    pose_position_ids,
    randpos_position_ids,
)
from longctx.data.sentences import sentence_lengths

METHODS = ("none", "pose", "randpos", "longrecipe")
"""`data.position_transform` values."""

RNG_TAG = 0x504F53
"""Second seed word of every transform generator, apart from the packer's (seed, epoch)."""


@dataclass(frozen=True)
class PositionTransform:
    """One method with its parameters; `apply` rewrites a row's position ids."""

    method: str
    target_length: int
    seed: int
    pose_chunks: int = 2
    pose_compat: str = "paper"
    longrecipe_compat: str = "paper"
    ends_sentence: np.ndarray | None = None
    """bool [vocab]: tokens that end a sentence (longrecipe only)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS[1:]:
            raise ValueError(f"data.position_transform: {self.method!r} is not one of {METHODS[1:]}")
        if self.method == "longrecipe" and self.ends_sentence is None:
            raise ValueError("data.position_transform=longrecipe needs the sentence-end table of the tokenizer")

    def document_ids(self, tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """int64 [n] ids of one document of n tokens."""
        n = len(tokens)
        if self.method == "pose":
            return pose_position_ids(n, self.target_length, rng, min(self.pose_chunks, n), self.pose_compat)
        if self.method == "randpos":
            return randpos_position_ids(n, self.target_length, rng)
        assert self.ends_sentence is not None  # checked in __post_init__
        lengths = sentence_lengths(tokens, self.ends_sentence)
        return longrecipe_position_ids(lengths, self.target_length, rng, self.longrecipe_compat)

    def apply(self, row: dict[str, torch.Tensor], row_index: int) -> dict[str, torch.Tensor]:
        """A contract row (tensors [T]) with its position ids transformed per document."""
        tokens = row["input_ids"].numpy()
        starts = np.flatnonzero(document_start_mask(row["document_ids"][None])[0].numpy())
        ends = np.append(starts[1:], len(tokens))
        positions = np.empty(len(tokens), dtype=np.int64)
        for document, (start, end) in enumerate(zip(starts, ends, strict=False)):
            rng = np.random.default_rng([self.seed, RNG_TAG, row_index, document])
            positions[start:end] = self.document_ids(tokens[start:end], rng)
        return {**row, "position_ids": torch.from_numpy(positions)}
