"""Packed training rows in the batch contract (DESIGN §3), in a world-size-invariant order.

A prepared dataset (`longctx prepare`) is a litdata directory with one item per document
(its tokens followed by EOS) plus `lengths.npy`, the token count of every item. Each epoch
shuffles the documents (seeded) and lays them end to end into one token stream; epochs
follow each other, so the stream is endless. Rows are consecutive, non-overlapping blocks
of `window + 1` stream tokens: the blocks partition the stream, so every token of every
document appears exactly once per epoch, and nothing is lost at chunk or row edges (a
document cut by a row boundary continues at the start of the next row; litdata's own
`TokensLoader` blocks would drop up to `window` tokens at every chunk edge).

A block x[0..T] becomes one row of the contract:

    input_ids    x[0:T]
    labels       x[1:T+1]
    doc_mask=true  (STRING: packed + varlen attention)
      document_ids  number of EOS tokens before t in the row: a new document after each EOS
      position_ids  t - (start of t's document): restart at 0 in every document
      labels        -100 at EOS inputs (the next token starts a document it cannot see)
    doc_mask=false (TinyLlama/litgpt: EOS-separated, plain causal)
      document_ids  0 everywhere;  position_ids 0..T-1

Order. litdata's distributed split hands each rank a contiguous range of items, so the
rows of one optimizer step would change with the world size and a 2-GPU run could not
reproduce a 1-GPU run. Here global row k is the same row in every run with the same seed,
and rank r of W takes rows k = r, r + W, r + 2W, ...: each optimizer step consumes the
same G rows at any world size (micro-batch x accumulation x world = G). Documents are
shuffled in groups (group order permuted, documents permuted inside a group) to keep reads
local to a few litdata chunks at a time. Several sources mix by smooth weighted
round-robin (exact proportions at every prefix, no sampling noise), e.g. ProLong's 60%
long / 40% short. The whole loader state is the number of global rows consumed, so
resuming at optimizer step s starts at row s * G: no loader state can be lost or double
counted, whatever the world size of the resumed run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from litdata import StreamingDataset

from longctx.batch import IGNORE_INDEX, document_start_index
from longctx.data.transforms import PositionTransform

LENGTHS_FILE = "lengths.npy"


def contract_from_blocks(blocks: torch.Tensor, eos_id: int, doc_mask: bool) -> dict[str, torch.Tensor]:
    """blocks [B, T+1] of consecutive stream tokens -> the batch contract dict of [B, T] tensors."""
    if blocks.dim() != 2 or blocks.shape[1] < 2:
        raise ValueError(f"blocks must be [batch, window + 1] with window >= 1, got {tuple(blocks.shape)}")
    input_ids = blocks[:, :-1].long()
    labels = blocks[:, 1:].long().clone()
    batch, window = input_ids.shape
    if not doc_mask:
        positions = torch.arange(window).expand(batch, window).clone()
        return {"input_ids": input_ids, "labels": labels, "position_ids": positions,
                "document_ids": torch.zeros_like(input_ids)}
    is_eos = input_ids == eos_id
    # A document starts at t = 0 and right after every EOS.
    starts_here = torch.zeros_like(is_eos)
    starts_here[:, 0] = True
    starts_here[:, 1:] = is_eos[:, :-1]
    document_ids = starts_here.long().cumsum(dim=1) - 1
    index = torch.arange(window).expand(batch, window)
    labels[is_eos] = IGNORE_INDEX
    return {"input_ids": input_ids, "labels": labels, "position_ids": index - document_start_index(document_ids),
            "document_ids": document_ids}


class PackedSource:
    """One prepared dataset read as an endless, per-epoch shuffled stream of tokens."""

    def __init__(self, path: str | Path, seed: int, shuffle: bool = True, group_size: int = 1024):
        local = "://" not in str(path)
        if local and not (Path(path) / "index.json").exists():
            raise FileNotFoundError(f"{path} is not a prepared dataset (no index.json); run `longctx prepare` first")
        if local and not (Path(path) / LENGTHS_FILE).exists():
            raise FileNotFoundError(f"{Path(path) / LENGTHS_FILE} is missing; re-run `longctx prepare` on this dataset")
        self.path = str(path)
        self.documents = StreamingDataset(self.path, shuffle=False)
        self.lengths = np.load(Path(path) / LENGTHS_FILE).astype(np.int64)
        # All items, not len(): under torch.distributed, len() counts this rank's share only.
        items = sum(end - start for start, end in self.documents.region_of_interest)
        if len(self.lengths) != items:
            raise ValueError(f"{path}: {LENGTHS_FILE} lists {len(self.lengths)} documents, the dataset has {items}")
        self.epoch_tokens = int(self.lengths.sum())
        if self.epoch_tokens == 0:
            raise ValueError(f"{path} holds no tokens")
        self.seed, self.shuffle, self.group_size = seed, shuffle, group_size
        self._epoch = -1
        self._order = self._ends = None

    def document_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.lengths))
        rng = np.random.default_rng([self.seed, epoch])
        return _grouped_permutation(len(self.lengths), self.group_size, rng)

    def _use_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._order = self.document_order(epoch)
            self._ends = np.cumsum(self.lengths[self._order])
            self._epoch = epoch

    def read(self, offset: int, count: int) -> torch.Tensor:
        """Tokens [offset, offset + count) of the endless stream."""
        pieces = []
        while count > 0:
            epoch, within = divmod(offset, self.epoch_tokens)
            self._use_epoch(epoch)
            slot = int(np.searchsorted(self._ends, within, side="right"))
            document_start = int(self._ends[slot] - self.lengths[self._order[slot]])
            tokens = self.documents[int(self._order[slot])]
            piece = torch.as_tensor(np.asarray(tokens))[within - document_start : within - document_start + count]
            pieces.append(piece)
            offset += len(piece)
            count -= len(piece)
        return torch.cat(pieces).long()


def _grouped_permutation(n: int, group_size: int, rng: np.random.Generator) -> np.ndarray:
    """Permute groups of `group_size` consecutive indices, then indices inside each group."""
    groups = [np.arange(start, min(start + group_size, n)) for start in range(0, n, group_size)]
    return np.concatenate([rng.permutation(groups[g]) for g in rng.permutation(len(groups))])


def weighted_round_robin(weights: list[float]) -> Iterator[int]:
    """Endless source indices in exact proportion to `weights` (smooth weighted round-robin:
    every source earns its weight each turn, the one with most credit is picked and pays 1)."""
    if not weights or any(w <= 0 for w in weights):
        raise ValueError(f"mixture weights must be positive, got {weights}")
    total = sum(weights)
    shares = [w / total for w in weights]
    credit = [0.0] * len(shares)
    while True:
        for i, share in enumerate(shares):
            credit[i] += share
        chosen = max(range(len(credit)), key=credit.__getitem__)
        credit[chosen] -= 1.0
        yield chosen


class PackedRows(torch.utils.data.IterableDataset):
    """Endless contract rows of `window` tokens for one rank, from global row `start_row` on.

    Iterated by a plain `DataLoader` (batch_size = micro-batch, num_workers = 0: a row is a
    few memory-mapped slices, far cheaper than a training step). A `transform` (PoSE,
    RandPos, LongRecipe: data/transforms.py) rewrites each row's position ids, seeded by the
    row's global index.
    """

    def __init__(
        self,
        sources: list[PackedSource],
        weights: list[float],
        *,
        window: int,
        eos_id: int,
        doc_mask: bool,
        rank: int = 0,
        world_size: int = 1,
        start_row: int = 0,
        transform: PositionTransform | None = None,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        if len(sources) != len(weights):
            raise ValueError(f"need one weight per source, got {len(sources)} sources and {len(weights)} weights")
        self.sources, self.weights = sources, weights
        self.window, self.eos_id, self.doc_mask = window, eos_id, doc_mask
        self.rank, self.world_size, self.start_row = rank, world_size, start_row
        self.transform = transform

    def global_rows(self) -> Iterator[tuple[int, int, int]]:
        """(global row index, source, row index within that source) for this rank."""
        rows_taken = [0] * len(self.sources)
        for index, source in enumerate(weighted_round_robin(self.weights)):
            row = rows_taken[source]
            rows_taken[source] += 1
            if index >= self.start_row and index % self.world_size == self.rank:
                yield index, source, row

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        block = self.window + 1
        for index, source, row in self.global_rows():
            tokens = self.sources[source].read(row * block, block)
            contract = contract_from_blocks(tokens[None], self.eos_id, self.doc_mask)
            contract = {key: value[0] for key, value in contract.items()}
            yield contract if self.transform is None else self.transform.apply(contract, index)


def tokens_per_step(window: int, micro_batch_size: int, world_size: int, global_batch_tokens: int) -> tuple[int, int]:
    """(gradient accumulation steps, rows per optimizer step) for a global batch in tokens.

    2K and 4K windows at the same `global_batch_tokens` consume the same tokens per step;
    the 4K run accumulates twice as many micro-batches (STRING A.2).
    """
    rows_per_micro_step = micro_batch_size * world_size
    tokens_per_micro_step = window * rows_per_micro_step
    if global_batch_tokens % tokens_per_micro_step:
        raise ValueError(
            f"train.global_batch_tokens={global_batch_tokens} is not a multiple of data.window x "
            f"train.micro_batch_size x world size = {window} x {micro_batch_size} x {world_size} = {tokens_per_micro_step}; "
            f"use a global batch of {math.ceil(global_batch_tokens / tokens_per_micro_step) * tokens_per_micro_step} tokens "
            f"or change the micro-batch / number of devices"
        )
    accumulation = global_batch_tokens // tokens_per_micro_step
    return accumulation, accumulation * rows_per_micro_step


class GlobalOrderSampler(torch.utils.data.Sampler[int]):
    """World-size-invariant order over a map-style dataset of `size` rows (e.g. SFT rows).

    Global row k is row permutation_e[k mod size] with e = k // size, a fresh seeded
    permutation per epoch; rank r of W takes k = r, r + W, ... from `start_row` on, exactly
    as `PackedRows` does for token streams. Endless: the Trainer's max_steps ends it.
    """

    def __init__(self, size: int, *, seed: int, rank: int = 0, world_size: int = 1, start_row: int = 0):
        if size <= 0:
            raise ValueError("GlobalOrderSampler needs at least one row")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.size, self.seed, self.rank, self.world_size, self.start_row = size, seed, rank, world_size, start_row

    def __iter__(self) -> Iterator[int]:
        first = self.start_row + (self.rank - self.start_row) % self.world_size
        epoch, order = -1, None
        for index in itertools.count(first, self.world_size):
            if index // self.size != epoch:
                epoch = index // self.size
                order = np.random.default_rng([self.seed, epoch]).permutation(self.size)
            yield int(order[index % self.size])
