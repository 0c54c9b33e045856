"""Packed training rows in the batch contract (docs/design.md §3), in a world-size-invariant order.

A prepared dataset (`longctx prepare`) is a litdata directory with one item per document
(its tokens followed by EOS) plus `lengths.npy`, the token count of every item; local, or
an object-store prefix (`s3://bucket/data`) read through litdata's storage layer
(`data/storage.py`). Each epoch shuffles the documents (seeded) and lays them end to end
into one token stream; epochs follow each other, so the stream is endless. Rows are
consecutive, non-overlapping blocks of `window + 1` stream tokens: the blocks partition the
stream, so every token of every document appears exactly once per epoch, and nothing is
lost at chunk or row edges (a document cut by a row boundary continues at the start of the
next row; litdata's own `TokensLoader` blocks would drop up to `window` tokens at every
chunk edge).

A block x[0..T] becomes one row of the contract:

    input_ids    x[0:T]
    labels       x[1:T+1]
    doc_mask=true  (STRING: packed + varlen attention)
      document_ids  number of EOS tokens before t in the row: a new document after each EOS
      position_ids  t - (start of t's document): restart at 0 in every document
      labels        -100 at EOS inputs (the next token starts a document it cannot see)
    doc_mask=false (TinyLlama/litgpt: EOS-separated, plain causal)
      document_ids  0 everywhere;  position_ids 0..T-1

Packing `documents` (`data.packing`, after Ding et al. 2024, "Fewer Truncations Improve
Language Modeling"): rows hold whole documents instead of stream blocks. The epoch's
documents, in the same shuffled order, fill rows greedily: a document goes into the
current row if it fits in its `window + 1` tokens, else it starts the next row; a document
longer than a row fills rows of its own, cut into `window + 1`-token pieces, or with
`data.long_documents: drop` is left out (a piece of a retrieval document can ask for facts
that are in another piece: docs/replication_log.md measured that 18% of such rows keep a
2-layer model at chance). The unused end
of a row is padding: one padding segment (its own document id, positions from 0) of EOS
inputs whose labels are all -100, so it trains nothing and no real token attends to it.
The cost is the padding (with the CPU replication's documents: a quarter to a third of a
row); the gain is that a document shorter than the window is never cut, so a question and
the facts it asks for are always in one row when the window can hold them. The `stream`
default cuts every document a row boundary crosses (the usual pretraining packing, and
STRING's): its second piece asks for facts it cannot see. A row is located by the row
tables of the epochs before it (one greedy pass over the documents per epoch), so a resume
costs O(documents) per epoch skipped instead of the stream's closed form.

Answers cut from their facts (`mask_cut_answers`, data/answer_spans.py). A retrieval
source stores where each answer and the fact it copies sit; in a row whose start falls
between the two (stream packing, or a split piece of a long document) the answer's labels
become -100, since the row cannot see the value it would have to copy, and every other
label stays. `masking_report` counts those answers over the rows of a run.

Order. litdata's distributed split hands each rank a contiguous range of items, so the
rows of one optimizer step would change with the world size and a 2-GPU run could not
reproduce a 1-GPU run. Here global row k is the same row in every run with the same seed,
and rank r of W takes rows k = r, r + W, r + 2W, ...: each optimizer step consumes the
same G rows at any world size (micro-batch x accumulation x world = G). Documents are
shuffled in groups (group order permuted, documents permuted inside a group) to keep reads
local to a few litdata chunks at a time. Several sources mix in a fixed interleaving
(`Mixture`: within one row of the exact proportions at every prefix, no sampling noise),
e.g. ProLong's 60% long / 40% short. The whole loader state is the number of global rows
consumed, so resuming at optimizer step s starts at row s * G: no loader state can be lost
or double counted, whatever the world size of the resumed run. Both the mixture and the
token stream are closed-form in the row index (the mixture in O(sources), a source's
epoch and document by one permutation and a binary search), so a resume seeks to its row
instead of replaying the rows before it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from litdata import StreamingDataset

from longctx.batch import IGNORE_INDEX, document_start_index
from longctx.data import storage
from longctx.data.answer_spans import AnswerIndex, cut_positions, masking_report, read_answers
from longctx.data.integrity import ChunkLocator, item_count, verify_dataset
from longctx.data.positions import check_choice
from longctx.data.row_padding import pad_each_document
from longctx.data.transforms import PositionTransform
from longctx.errors import DataError

LENGTHS_FILE = "lengths.npy"
PACKINGS = ("stream", "documents")
"""`data.packing`: stream blocks (documents cut at row boundaries) | whole documents per row."""
LONG_DOCUMENTS = ("split", "drop")
"""`data.long_documents` (packing=documents): split a document longer than a row | leave it out."""


def contract_from_blocks(blocks: torch.Tensor, eos_id: int, doc_mask: bool) -> dict[str, torch.Tensor]:
    """blocks [B, T+1] of consecutive stream tokens -> the batch contract dict of [B, T] tensors."""
    if blocks.dim() != 2 or blocks.shape[1] < 2:
        raise ValueError(f"blocks must be [batch, window + 1] with window >= 1, got {tuple(blocks.shape)}")
    input_ids = blocks[:, :-1].long()
    labels = blocks[:, 1:].long().clone()
    batch, window = input_ids.shape
    if not doc_mask:
        positions = torch.arange(window).expand(batch, window).clone()
        return {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": positions,
            "document_ids": torch.zeros_like(input_ids),
        }
    is_eos = input_ids == eos_id
    # A document starts at t = 0 and right after every EOS.
    starts_here = torch.zeros_like(is_eos)
    starts_here[:, 0] = True
    starts_here[:, 1:] = is_eos[:, :-1]
    document_ids = starts_here.long().cumsum(dim=1) - 1
    index = torch.arange(window).expand(batch, window)
    labels[is_eos] = IGNORE_INDEX
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": index - document_start_index(document_ids),
        "document_ids": document_ids,
    }


class PackedSource:
    """One prepared dataset read as an endless, per-epoch shuffled stream of tokens."""

    def __init__(self, path: str | Path, seed: int, shuffle: bool = True, group_size: int = 1024):
        self.path = str(path)
        if not storage.exists(storage.join(self.path, "index.json")):
            raise FileNotFoundError(
                f"{self.path} is not a prepared dataset (no index.json); run `longctx prepare` first"
            )
        lengths_file = storage.join(self.path, LENGTHS_FILE)
        if not storage.exists(lengths_file):
            raise FileNotFoundError(f"{lengths_file} is missing; re-run `longctx prepare` on this dataset")
        verify_dataset(self.path, "sizes")  # every local chunk's size against its record (data/integrity.py)
        self.documents = StreamingDataset(self.path, shuffle=False)
        self._chunks = ChunkLocator(self.path)
        self.lengths = storage.read_array(lengths_file).astype(np.int64)
        items = item_count(self.documents)
        if len(self.lengths) != items:  # not written whole
            raise ValueError(f"{path}: {LENGTHS_FILE} lists {len(self.lengths)} of {items} documents; prepare it anew")
        self.epoch_tokens = int(self.lengths.sum())
        if self.epoch_tokens == 0:
            raise ValueError(f"{path} holds no tokens")
        self.seed, self.shuffle, self.group_size = seed, shuffle, group_size
        answers = read_answers(self.path)
        self.answers = None if answers is None else AnswerIndex(answers, len(self.lengths))
        """Answer and fact token spans of a retrieval source (data/answer_spans.py), else None."""
        self._epoch = -1  # no epoch loaded yet: _order/_ends are filled by _use_epoch
        self._order: np.ndarray = np.empty(0, dtype=np.int64)
        self._ends: np.ndarray = np.empty(0, dtype=np.int64)
        # packing=documents: rows per epoch (filled in order as rows are asked for) and the
        # row table of one epoch, for the (row tokens, long_documents) in `_table_key`.
        self._epoch_rows: list[int] = []
        self._table_key: tuple[int, str, int] = (0, "", 1)
        self._table_epoch = -1
        self._table: np.ndarray = np.empty((0, 3), dtype=np.int64)

    def _document(self, item: int) -> np.ndarray:
        """Document `item`'s tokens; a failure inside litdata's loader names the chunk."""
        try:
            return np.asarray(self.documents[item])
        except Exception as error:  # struct.error, RuntimeError, ChunkWaitTimeoutError, ... from litdata
            raise self._chunks.read_error(item, error) from error

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

    def stream_pieces(self, offset: int, count: int) -> list[tuple[int, int, int]]:
        """The documents of stream tokens [offset, offset + count): (item, first token of the
        item inside the range, its position in the range), in stream order."""
        pieces = []
        at = 0
        while at < count:
            epoch, within = divmod(offset + at, self.epoch_tokens)
            self._use_epoch(epoch)
            slot = int(np.searchsorted(self._ends, within, side="right"))
            document_start = int(self._ends[slot] - self.lengths[self._order[slot]])
            pieces.append((int(self._order[slot]), within - document_start, at))
            at += int(self._ends[slot]) - within
        return pieces

    def read(self, offset: int, count: int) -> torch.Tensor:
        """Tokens [offset, offset + count) of the endless stream."""
        return self._tokens(self.stream_pieces(offset, count), count)

    def _tokens(self, pieces: list[tuple[int, int, int]], count: int) -> torch.Tensor:
        """The tokens of `pieces` (item, first token, position) in a range of `count` tokens."""
        parts = [torch.as_tensor(self._document(item))[first : first + count - at] for item, first, at in pieces]
        return torch.cat(parts).long()

    def document_rows(self, epoch: int, block: int, long_documents: str = "split", granule: int = 1) -> np.ndarray:
        """The rows of `epoch` under packing=documents: int64 [rows, 3] of (first slot, end
        slot, piece) into `document_order(epoch)`; piece -1 = whole documents first..end-1,
        piece p >= 0 = tokens [p block, (p + 1) block) of the one longer document `first`.
        long_documents="drop" leaves documents longer than `block` out instead of splitting;
        `granule` g: a document takes its length rounded up to a multiple of g (data/row_padding.py)."""
        lengths = self.lengths[self.document_order(epoch)]
        rounded = -(-lengths // granule) * granule
        rows: list[tuple[int, int, int]] = []
        first, used = 0, 0
        for slot, (length, padded) in enumerate(zip(lengths.tolist(), rounded.tolist(), strict=True)):
            if length > block:
                if used:
                    rows.append((first, slot, -1))
                if long_documents == "split":
                    rows += [(slot, slot + 1, piece) for piece in range(-(-length // block))]
                first, used = slot + 1, 0
            elif used + padded > block:
                if used:
                    rows.append((first, slot, -1))
                first, used = slot, padded
            else:
                used += padded
        if used:
            rows.append((first, len(lengths), -1))
        return np.asarray(rows, dtype=np.int64).reshape(-1, 3)

    def row_pieces(
        self, row: int, block: int, long_documents: str = "split", granule: int = 1
    ) -> list[tuple[int, int, int]]:
        """The documents of row `row` of the endless packing=documents sequence, as
        `stream_pieces` gives them: (item, first token of the item in the row, its position)."""
        if (block, long_documents, granule) != self._table_key:
            self._epoch_rows, self._table_key, self._table_epoch = [], (block, long_documents, granule), -1
        epoch = 0
        while True:
            if epoch == len(self._epoch_rows):  # first visit: its table is counted and kept
                self._table, self._table_epoch = self.document_rows(epoch, block, long_documents, granule), epoch
                if len(self._table) == 0:
                    raise DataError(f"{self.path}: no document fits a row of {block} tokens (data.long_documents=drop)")
                self._epoch_rows.append(len(self._table))
            if row < self._epoch_rows[epoch]:
                break
            row -= self._epoch_rows[epoch]
            epoch += 1
        if epoch != self._table_epoch:
            self._table, self._table_epoch = self.document_rows(epoch, block, long_documents, granule), epoch
        self._use_epoch(epoch)
        first, end, piece = (int(value) for value in self._table[row])
        if piece >= 0:
            return [(int(self._order[first]), piece * block, 0)]
        items = [int(self._order[slot]) for slot in range(first, end)]
        starts = np.concatenate([[0], np.cumsum(self.lengths[items])[:-1]]).tolist()
        return [(item, 0, int(at)) for item, at in zip(items, starts, strict=True)]

    def documents_epoch(self, row: int) -> int:
        """The epoch of row `row` of the packing=documents sequence `row_pieces` last read."""
        return int(np.searchsorted(np.cumsum(self._epoch_rows), row, side="right"))

    def read_row(self, row: int, block: int, long_documents: str = "split", granule: int = 1) -> torch.Tensor:
        """Row `row` of the endless packing=documents sequence: at most `block` tokens."""
        return self._tokens(self.row_pieces(row, block, long_documents, granule), block)

    def cut_answers(self, pieces: list[tuple[int, int, int]], count: int) -> np.ndarray:
        """Positions of a row of `count` tokens made of `pieces` whose label is an answer cut
        from its fact (data/answer_spans.py); empty for a source without answer spans."""
        if self.answers is None:
            return np.empty(0, dtype=np.int64)
        return cut_positions(pieces, self.answers, count)


def pad_documents_row(tokens: torch.Tensor, block: int, eos_id: int, doc_mask: bool) -> dict[str, torch.Tensor]:
    """The contract row of `tokens` (<= block, ending in EOS when shorter) padded to `block`:
    the padding is one segment of EOS inputs with label -100 and positions from 0."""
    real = len(tokens)
    if real > block:
        raise ValueError(f"a row holds at most {block} tokens, got {real}")
    padded = torch.full((1, block), eos_id, dtype=torch.long)
    padded[0, :real] = tokens
    contract = {key: value[0] for key, value in contract_from_blocks(padded, eos_id, doc_mask).items()}
    if real < block:
        contract["labels"][max(real - 1, 0) :] = IGNORE_INDEX
        if doc_mask and real < block - 1:
            padding = torch.arange(block - 1 - real)
            contract["document_ids"][real:] = contract["document_ids"][real]
            contract["position_ids"][real:] = padding
    return contract


def _grouped_permutation(n: int, group_size: int, rng: np.random.Generator) -> np.ndarray:
    """Permute groups of `group_size` consecutive indices, then indices inside each group."""
    groups = [np.arange(start, min(start + group_size, n)) for start in range(0, n, group_size)]
    return np.concatenate([rng.permutation(groups[g]) for g in rng.permutation(len(groups))])


class Mixture:
    """Which source global row k comes from, and which of that source's rows it is, in
    O(number of sources) time for any k: resuming at step s seeks to row s * G directly.

    Source i takes its share of the rows the sources before it left over,
    q_i = w_i / (w_i + ... + w_last). Of the first n rows that reach source i, it takes

        c_i(n) = floor(n q_i + 1/2)

    (Bresenham's line): row n of that level is source i's row c_i(n) exactly when
    c_i(n + 1) > c_i(n), otherwise it is row n - c_i(n) of the next level. Each count stays
    within one row of n x w_i / sum(w) at every prefix. For two sources this is the smooth
    weighted round-robin (each source earns its share per row, the richest is picked, ties
    to the first) in exact arithmetic. Weights are read as exact decimal fractions (0.6 is
    3/5), so the order is the same on every machine and at every step.
    """

    def __init__(self, weights: list[float]):
        if not weights or any(not w > 0 for w in weights):
            raise ValueError(f"mixture weights must be positive, got {weights}")
        exact = [Fraction(str(float(w))) for w in weights]
        self._levels = []  # (numerator, denominator) of q_i for every source but the last
        for i in range(len(exact) - 1):
            share = exact[i] / sum(exact[i:])
            self._levels.append((share.numerator, share.denominator))

    def locate(self, index: int) -> tuple[int, int]:
        """(source, row within that source) of global row `index`."""
        for source, (num, den) in enumerate(self._levels):
            taken = (2 * index * num + den) // (2 * den)
            if (2 * (index + 1) * num + den) // (2 * den) > taken:
                return source, taken
            index -= taken
        return len(self._levels), index


class PackedRows(torch.utils.data.IterableDataset):
    """Endless contract rows of `window` tokens for one rank, from global row `start_row` on.

    Iterated by a `DataLoader` with batch_size = `micro_batch_size`. With `num_workers` = W
    > 0, worker w yields this rank's micro-batches w, w + W, w + 2W, ... (whole batches,
    which the DataLoader takes from its workers in turn), so the batch sequence equals the
    in-process one and resume stays exact. A `transform` (PoSE, RandPos, LongRecipe:
    data/transforms.py) rewrites each row's position ids, seeded by the row's global index.
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
        packing: str = "stream",
        long_documents: str = "split",
        micro_batch_size: int = 1,
        mask_cut_answers: bool = False,
        document_granule: int = 1,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        if len(sources) != len(weights):
            raise ValueError(f"need one weight per source, got {len(sources)} sources and {len(weights)} weights")
        check_choice("packing", packing, PACKINGS)
        check_choice("long_documents", long_documents, LONG_DOCUMENTS)
        Mixture(weights)  # check the weights now, not at the first batch
        self.sources, self.weights = sources, weights
        self.window, self.eos_id, self.doc_mask = window, eos_id, doc_mask
        self.rank, self.world_size, self.start_row = rank, world_size, start_row
        self.transform, self.packing, self.long_documents = transform, packing, long_documents
        self.micro_batch_size = micro_batch_size
        self.mask_cut_answers = mask_cut_answers
        self.granule = document_granule  # packing=documents: each document padded to a multiple

    def global_rows(self) -> Iterator[tuple[int, int, int]]:
        """(global row index, source, row index within that source) for this rank, from the
        first of its rows at or after `start_row` (a seek, not a replay of earlier rows)."""
        mixture = Mixture(self.weights)
        first = self.start_row + (self.rank - self.start_row) % self.world_size
        for index in itertools.count(first, self.world_size):
            yield index, *mixture.locate(index)

    def worker_rows(self) -> Iterator[tuple[int, int, int]]:
        """`global_rows` of this DataLoader worker: its share of whole micro-batches."""
        worker = torch.utils.data.get_worker_info()
        if worker is None:
            yield from self.global_rows()
            return
        for k, located in enumerate(self.global_rows()):
            if (k // self.micro_batch_size) % worker.num_workers == worker.id:
                yield located

    def _pieces(self, source: int, row: int) -> list[tuple[int, int, int]]:
        block = self.window + 1
        if self.packing == "documents":
            return self.sources[source].row_pieces(row, block, self.long_documents, self.granule)
        return self.sources[source].stream_pieces(row * block, block)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        block = self.window + 1
        for index, source, row in self.worker_rows():
            if self.packing == "documents":
                tokens = self.sources[source].read_row(row, block, self.long_documents, self.granule)
                contract = pad_documents_row(tokens, block, self.eos_id, self.doc_mask)
                if self.granule > 1:
                    contract = pad_each_document(contract, min(len(tokens), self.window), self.granule)
            else:
                tokens = self.sources[source].read(row * block, block)
                contract = {k: v[0] for k, v in contract_from_blocks(tokens[None], self.eos_id, self.doc_mask).items()}
            if self.mask_cut_answers:
                cut = self.sources[source].cut_answers(self._pieces(source, row), block)
                contract["labels"][torch.as_tensor(cut - 1)] = IGNORE_INDEX
            yield contract if self.transform is None else self.transform.apply(contract, index)

    def masking_report(self, rows: int) -> list[dict[str, float] | None]:
        """Per source, over the first `rows` global rows (all ranks): the answers with a label
        in them and how many of those are cut from their fact (masked when
        `mask_cut_answers`); None for a source without answer spans."""
        if all(source.answers is None for source in self.sources):
            return [None] * len(self.sources)
        block = self.window + 1
        seen: list[set] = [set() for _ in self.sources]
        cut: list[set] = [set() for _ in self.sources]
        mixture = Mixture(self.weights)
        for index in range(rows):
            source, row = mixture.locate(index)
            answers = self.sources[source].answers
            if answers is None:
                continue
            for item, first, at in self._pieces(source, row):
                # an answer occurs once per pass over its source: key it by (item, answer, pass)
                if self.packing == "stream":
                    epoch = (row * block + at - first) // self.sources[source].epoch_tokens
                else:
                    epoch = self.sources[source].documents_epoch(row)
                for k, (start, end, fact) in enumerate(answers.of(item).tolist()):
                    if max(start - first + at, 1) < min(end - first + at, block):
                        seen[source].add((item, k, epoch))
                        if fact < first:
                            cut[source].add((item, k, epoch))
        return [
            None if self.sources[i].answers is None else masking_report(len(seen[i]), len(cut[i]))
            for i in range(len(self.sources))
        ]


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
        epoch, order = -1, np.empty(0, dtype=np.int64)
        for index in itertools.count(first, self.world_size):
            if index // self.size != epoch:
                epoch = index // self.size
                order = np.random.default_rng([self.seed, epoch]).permutation(self.size)
            yield int(order[index % self.size])
