"""Next-token cross-entropy without [tokens, vocab] fp32 logits.

    loss_sum = chunked_cross_entropy(hidden, model.output, labels, chunk_tokens=4096)

The plain loss materialises logits = hidden W^T for every token, upcast to fp32: at
T=2048 x 8 rows and a 32,000-token vocabulary that is 2 GiB, plus its gradient. Here the
tokens go in chunks; each chunk's logits are computed, reduced to its summed loss and
dropped, and recomputed in backward (activation checkpointing), so at most one chunk's
[chunk_tokens, vocab] fp32 logits exist at a time. Same value and gradients as
F.cross_entropy(head(hidden).float(), labels, reduction="sum") up to summation order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from longctx.batch import IGNORE_INDEX


def chunked_cross_entropy(
    hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, chunk_tokens: int, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """Summed cross-entropy of head(hidden) [N, vocab] (in fp32) against labels [N] over the
    tokens whose label is not `ignore_index`; hidden [N, d], chunks of `chunk_tokens`."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be > 0, got {chunk_tokens}")
    if hidden.shape[:-1] != labels.shape or hidden.dim() != 2:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} must be [N, d] with labels [N], got labels {tuple(labels.shape)}"
        )

    def chunk_loss(chunk: torch.Tensor, chunk_labels: torch.Tensor) -> torch.Tensor:
        logits = head(chunk).float()
        return F.cross_entropy(logits, chunk_labels, ignore_index=ignore_index, reduction="sum")

    total = hidden.new_zeros((), dtype=torch.float32)
    for chunk, chunk_labels in zip(hidden.split(chunk_tokens), labels.split(chunk_tokens), strict=True):
        if torch.is_grad_enabled():
            total = total + checkpoint(chunk_loss, chunk, chunk_labels, use_reentrant=False)
        else:
            total = total + chunk_loss(chunk, chunk_labels)
    return total
