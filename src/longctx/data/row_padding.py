"""Each document of a packed row padded to a multiple of g tokens (g = 2 x the
context-parallel size), for the per-document head-tail load balance
(train/context_parallel.py: every document is cut into 2N equal chunks, rank c taking
chunks c and 2N-1-c, so each rank does 1/N of every document's causal work).

Under `data.packing=documents` a row holds whole documents and one trailing padding
segment (data/packing.py); the packing counts each document at its rounded length
ceil(L / g) g, so the rounded documents fit the row. Here each document of L tokens is
followed by ceil(L / g) g - L padding tokens of its own document id: EOS inputs, label -100,
position ids continuing its own. They come after every real token of the document, so
causal attention never shows them to a real token, and unlabelled they are no query of
f(i) (`probe.fi_count_only_labeled`, the default): the real tokens' outputs, the loss and
f(i) are those of the unpadded row. The trailing segment takes what is left, a multiple of
g too since the window is (config/train.py checks it).
"""

from __future__ import annotations

import torch

from longctx.batch import IGNORE_INDEX


def pad_each_document(contract: dict[str, torch.Tensor], real: int, granule: int) -> dict[str, torch.Tensor]:
    """The [T] contract row with documents in its first `real` positions, each padded to a
    multiple of `granule`, then the trailing padding segment."""
    length = contract["input_ids"].shape[0]
    _, sizes = torch.unique_consecutive(contract["document_ids"][:real], return_counts=True)
    padded = (sizes + granule - 1) // granule * granule
    if int(padded.sum()) > length:
        raise ValueError(
            f"documents of {sizes.tolist()} tokens padded to multiples of {granule} exceed the row of {length}"
        )
    pad_token = contract["input_ids"][-1] if real < length else contract["input_ids"][real - 1]
    out = {
        "input_ids": torch.full_like(contract["input_ids"], int(pad_token)),
        "labels": torch.full_like(contract["labels"], IGNORE_INDEX),
        "position_ids": torch.zeros_like(contract["position_ids"]),
        "document_ids": torch.full_like(contract["document_ids"], len(sizes)),
    }
    source = target = 0
    for document, (size, width) in enumerate(zip(sizes.tolist(), padded.tolist(), strict=True)):
        for key in ("input_ids", "labels", "position_ids"):
            out[key][target : target + size] = contract[key][source : source + size]
        last = int(contract["position_ids"][source + size - 1])
        out["position_ids"][target + size : target + width] = torch.arange(last + 1, last + 1 + width - size)
        out["document_ids"][target : target + width] = document
        source, target = source + size, target + width
    out["position_ids"][target:] = torch.arange(length - target)
    return out
