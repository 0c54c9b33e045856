"""Next-token cross-entropy without [tokens, vocab] fp32 logits.

    loss_sum = chunked_cross_entropy(hidden, model.output, labels, chunk_tokens=4096)
    loss_sum = chunked_cross_entropy(hidden, model.output, labels, 4096, kernel="compiled")

The plain loss materialises logits = hidden W^T for every token, upcast to fp32: at
T=2048 x 8 rows and a 32,000-token vocabulary that is 2 GiB, plus its gradient. Here the
tokens go in chunks; each chunk's logits are computed, reduced to its summed loss and
dropped, and recomputed in backward (activation checkpointing), so at most one chunk's
[chunk_tokens, vocab] fp32 logits exist at a time. Same value and gradients as
F.cross_entropy(head(hidden).float(), labels, reduction="sum") up to summation order.

Kernels (LOSS_KERNELS), all the same sum:
- chunked: each chunk eager (head matmul, fp32 upcast, log-softmax, gather: separate kernels).
- compiled: the same chunk function through torch.compile, so the upcast, log-softmax and
  gather of a chunk fuse into a few kernels around the matmul (one graph per chunk shape:
  every full chunk plus the last one).
- liger: Liger-Kernel's LigerFusedLinearCrossEntropyLoss (Triton, CUDA only), which
  chunks internally and computes the gradients during forward; `chunk_tokens` unused.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from longctx.batch import IGNORE_INDEX
from longctx.config.train import LOSS_KERNELS

LIGER_MISSING = (
    "train.loss_kernel=liger needs the package liger_kernel (CUDA + Triton): "
    "pip install liger-kernel, or on the GPU image stage it with `make device`"
)


def _chunk_loss(head: nn.Module, chunk: torch.Tensor, chunk_labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """sum over labelled tokens of -log softmax(head(chunk) in fp32, or wider)[label]."""
    logits = head(chunk)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits, chunk_labels, ignore_index=ignore_index, reduction="sum")


@functools.cache
def _compiled_chunk_loss() -> Callable[..., torch.Tensor]:
    """torch.compile of _chunk_loss, built once per process (dynamic=False: the chunk
    shapes are fixed by chunk_tokens, so at most two graphs per head)."""
    return torch.compile(_chunk_loss, dynamic=False)


def liger_cross_entropy(
    hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """The summed loss by LigerFusedLinearCrossEntropyLoss(head.weight, hidden, labels,
    head.bias), its gradients accumulated in fp32; under CUDA autocast the operands are cast
    to the autocast dtype first, as the head's F.linear would be (Triton ignores autocast).
    A RuntimeError naming the package when liger_kernel is not importable."""
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as error:
        raise RuntimeError(LIGER_MISSING) from error
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"train.loss_kernel=liger needs a head with a .weight, got {type(head).__name__}")
    bias = getattr(head, "bias", None)
    if hidden.is_cuda and torch.is_autocast_enabled("cuda"):  # as F.linear under autocast: bf16 operands
        dtype = torch.get_autocast_dtype("cuda")
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    loss = LigerFusedLinearCrossEntropyLoss(ignore_index=ignore_index, reduction="sum", accum_dtype=torch.float32)
    return loss(weight, hidden, labels, bias).float()


def chunked_cross_entropy(
    hidden: torch.Tensor,
    head: nn.Module,
    labels: torch.Tensor,
    chunk_tokens: int,
    ignore_index: int = IGNORE_INDEX,
    kernel: str = "chunked",
) -> torch.Tensor:
    """Summed cross-entropy of head(hidden) [N, vocab] (in fp32) against labels [N] over the
    tokens whose label is not `ignore_index`; hidden [N, d], chunks of `chunk_tokens`,
    each chunk by `kernel` (one of LOSS_KERNELS; module docstring)."""
    if kernel not in LOSS_KERNELS:
        raise ValueError(f"loss kernel {kernel!r} is not one of {LOSS_KERNELS}")
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be > 0, got {chunk_tokens}")
    if hidden.shape[:-1] != labels.shape or hidden.dim() != 2:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} must be [N, d] with labels [N], got labels {tuple(labels.shape)}"
        )
    if kernel == "liger":
        return liger_cross_entropy(hidden, head, labels, ignore_index)
    chunk_loss = _compiled_chunk_loss() if kernel == "compiled" else _chunk_loss

    total = hidden.new_zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32))
    for chunk, chunk_labels in zip(hidden.split(chunk_tokens), labels.split(chunk_tokens), strict=True):
        if torch.is_grad_enabled():
            total = total + checkpoint(chunk_loss, head, chunk, chunk_labels, ignore_index, use_reentrant=False)
        else:
            total = total + chunk_loss(head, chunk, chunk_labels, ignore_index)
    return total
