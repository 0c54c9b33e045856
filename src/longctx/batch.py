"""The batch contract: the four [B, T] tensors every model, probe and loss reads.

    batch = {"input_ids": ..., "labels": ..., "position_ids": ..., "document_ids": ...}
    check_batch(batch)                               # shapes, dtypes, invariants
    starts = document_start_index(batch["document_ids"])

| key            | meaning                                                                  |
|----------------|--------------------------------------------------------------------------|
| `input_ids`    | token ids                                                                |
| `labels`       | next-token targets; IGNORE_INDEX where no loss (prompts, pad, doc ends)  |
| `position_ids` | the RoPE index of each token: reset to 0 per document when packing with   |
|                | masks, rewritten by SkipAlign / PoSE / RandPos / LongRecipe               |
| `document_ids` | segment id of each token: attention is causal and within one document     |

Invariants (checked by `check_batch`):
- all four are integer tensors of one shape [B, T];
- a document is one contiguous run of equal `document_ids` in a row (the varlen kernels
  cut rows at id changes, so the same id appearing twice in a row would be two
  documents to them and one to a dense mask);
- `position_ids` increase strictly inside each document (the transforms may skip ids but
  never repeat or reorder them), so a key's relative position to a query is positive.

Masks come from `document_ids`, never from `position_ids == 0` (which breaks for chat
data and for transformed ids). The relative-position counter f(i) reads exactly
`(document_ids, position_ids, labels)`, the same tensors the attention kernels see, so
what is logged is what was trained.

Document boundaries are computed here and nowhere else: `document_start_mask` (where a
document begins), `document_start_index` (the index of each token's document start) and
`document_segments` / `cu_seqlens` (documents of all rows laid end to end, the layout of
the variable-length FlashAttention kernels).
"""

from __future__ import annotations

from typing import TypedDict

import torch

IGNORE_INDEX = -100
"""`labels` value of a token without a loss (PyTorch's cross-entropy default)."""

INPUT_IDS = "input_ids"
LABELS = "labels"
POSITION_IDS = "position_ids"
DOCUMENT_IDS = "document_ids"
BATCH_KEYS = (INPUT_IDS, LABELS, POSITION_IDS, DOCUMENT_IDS)


class Batch(TypedDict):
    """A training or evaluation batch: four [B, T] int64 tensors (see the module docstring)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    document_ids: torch.Tensor


def check_batch(batch: dict[str, torch.Tensor]) -> None:
    """Raise ValueError naming the key, row and index at which `batch` breaks the contract."""
    missing = [key for key in BATCH_KEYS if key not in batch]
    if missing:
        raise ValueError(f"batch lacks {missing}; the contract is {list(BATCH_KEYS)}")
    shape = tuple(batch[INPUT_IDS].shape)
    if len(shape) != 2:
        raise ValueError(f"batch[{INPUT_IDS!r}] must be [batch, tokens], got shape {shape}")
    for key in BATCH_KEYS:
        tensor = batch[key]
        if tuple(tensor.shape) != shape:
            raise ValueError(f"batch[{key!r}] has shape {tuple(tensor.shape)}, batch[{INPUT_IDS!r}] {shape}")
        if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
            raise ValueError(f"batch[{key!r}] must hold integers, got {tensor.dtype}")
    documents, positions = batch[DOCUMENT_IDS], batch[POSITION_IDS]
    starts = document_start_mask(documents)
    seen_before = _repeated_document(documents, starts)
    if seen_before is not None:
        row, index = seen_before
        raise ValueError(
            f"batch[{DOCUMENT_IDS!r}] row {row}: document {int(documents[row, index])} resumes at index {index} "
            "after another document; each document must be one contiguous run"
        )
    inside = ~starts[:, 1:]
    backwards = (positions[:, 1:] <= positions[:, :-1]) & inside
    if backwards.any():
        row, index = (int(i) for i in backwards.nonzero()[0])
        raise ValueError(
            f"batch[{POSITION_IDS!r}] row {row}: ids must increase inside a document, "
            f"got {int(positions[row, index])} -> {int(positions[row, index + 1])} at index {index + 1}"
        )


def _repeated_document(document_ids: torch.Tensor, starts: torch.Tensor) -> tuple[int, int] | None:
    """(row, index) of the first document start whose id already occurred earlier in its row."""
    distinct = torch.tensor([len(torch.unique(row)) for row in document_ids])
    if bool((starts.sum(dim=1).cpu() == distinct).all()):
        return None  # as many runs as distinct ids in every row: each document is contiguous
    for row, (ids, row_starts) in enumerate(zip(document_ids.tolist(), starts.tolist(), strict=True)):
        seen: set[int] = set()
        for index, (document, is_start) in enumerate(zip(ids, row_starts, strict=True)):
            if is_start:
                if document in seen:
                    return row, index
                seen.add(document)
    return None


def document_start_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: True at the first token of every document (index 0 and every id change)."""
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return starts


def document_start_index(document_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] int64: the index (within its row) of the first token of each token's document.

    `index - document_start_index` is the token's offset in its document: the position id
    of plain packing with masks.
    """
    index = torch.arange(document_ids.shape[1], device=document_ids.device).expand_as(document_ids)
    return torch.where(document_start_mask(document_ids), index, 0).cummax(dim=1).values


def document_segments(
    document_ids: torch.Tensor, q_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row cut at document boundaries, rows laid end to end.

    Returns (flat index of each document's first key, its key count, its query count).
    With `q_len` < T (decoding, chunked prefill) the queries are the last `q_len`
    positions of each row, so a document's query count is the part of it inside that
    window (zero for documents that end before it).
    """
    batch, kv_len = document_ids.shape
    offset = kv_len - (kv_len if q_len is None else q_len)
    # The one host synchronisation of the flash path: `nonzero`'s output size (the number of
    # documents, which sizes cu_seqlens and the kernel's grid) is data-dependent, so the host
    # waits for it. A fixed-size alternative (every token a possible segment start) would
    # launch B*T mostly empty segments per kernel call; a host-side layout from the loader
    # would change the batch contract. The end marker is a fill kernel (`new_full`), not a
    # pageable host copy (`new_tensor`), which would be a second sync.
    starts = document_start_mask(document_ids).flatten().nonzero().flatten()
    ends = torch.cat([starts[1:], starts.new_full((1,), batch * kv_len)])
    k_lengths = ends - starts
    local_start = starts % kv_len
    q_lengths = (local_start + k_lengths - local_start.clamp(min=offset)).clamp(min=0)
    return starts, k_lengths, q_lengths


def cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    """int32 cumulative lengths with a leading 0: segment s spans [cu[s], cu[s + 1]) of the
    flattened batch (FlashAttention's `cu_seqlens_q` / `cu_seqlens_k`)."""
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
