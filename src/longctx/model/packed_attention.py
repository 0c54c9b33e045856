"""The packed variable-length backends of `attention()` (model/attention.py): `flash` and
`xformers` lay the documents of all rows end to end and call one CUDA kernel on them.

`build_mask` precomputes a batch's layout once (`_flash_cu_seqlens`, `_xformers_bias`);
every layer then calls `_flash_attention` / `_xformers_attention` with it. `mask` is the
caller's AttentionMask (its `extra` and `window`), typed loosely here so this module does
not import the one that imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from longctx.batch import cu_seqlens, document_segments
from longctx.model import flash
from longctx.model.sinks import flash_with_sinks


@dataclass
class _FlashSegments:
    """The flash kernel's view of a batch; the max lengths are host ints, read once here, not
    per layer: from the caller's `max_seqlen` bound, else from the device (a host sync).
    Finding the document boundaries (`document_segments`, a `nonzero`) is the path's one
    remaining synchronisation, once per forward, named and justified in batch.py
    (longctx.gpu_checks.layout_sync_allowed allows it there and nowhere else)."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_q: int
    max_k: int
    kernel: flash.VarlenKernel

    def attend(self, q, k, v, *, scale: float, window: tuple[int, int], lse: bool = False):
        """`flash.varlen_flash` over these segments: (out, lse or None)."""
        cu_q, cu_k = self.cu_seqlens_q, self.cu_seqlens_k
        return flash.varlen_flash(
            q, k, v, cu_q, cu_k, self.max_q, self.max_k, scale=scale, window=window, lse=lse, kernel=self.kernel
        )


def _flash_cu_seqlens(document_ids: torch.Tensor, q_len: int, max_seqlen: int | None = None) -> _FlashSegments:
    _, k_lengths, q_lengths = document_segments(document_ids, q_len)
    if max_seqlen is None:
        max_q, max_k = torch.stack([q_lengths.max(), k_lengths.max()]).tolist()
    else:
        max_q, max_k = min(max_seqlen, q_len), max_seqlen
    return _FlashSegments(cu_seqlens(q_lengths), cu_seqlens(k_lengths), max_q, max_k, flash.resolve_kernel())


def _flash_attention(q, k, v, mask: Any, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    seg: _FlashSegments = mask.extra
    batch, q_len, heads, dim = q.shape
    packed = (q.reshape(-1, heads, dim), k.reshape(-1, k.shape[2], dim), v.reshape(-1, v.shape[2], dim))
    window = _flash_window(q_len, mask.window)
    if sinks is not None:
        out = flash_with_sinks(*packed, seg, window, scale, sinks)
    else:
        out, _ = seg.attend(*packed, scale=scale, window=window)
    return out.reshape(batch, q_len, heads, dim)


def _flash_window(q_len: int, window: int) -> tuple[int, int]:
    """The kernel's (left, right): causal, or the band of W - 1 keys before each query. One
    query without a window needs none (module docstring)."""
    if window:
        return (window - 1, 0)
    return flash.CAUSAL if q_len > 1 else flash.FULL


def _xformers_bias(document_ids: torch.Tensor, q_len: int, window: int = 0):
    from xformers.ops.fmha.attn_bias import BlockDiagonalCausalFromBottomRightMask

    _, k_lengths, q_lengths = document_segments(document_ids, q_len)
    return BlockDiagonalCausalFromBottomRightMask.from_seqlens(q_lengths.tolist(), kv_seqlen=k_lengths.tolist())


def _xformers_attention(q, k, v, mask: Any, scale: float) -> torch.Tensor:
    from xformers.ops import memory_efficient_attention

    batch, q_len, heads, dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    # xformers expresses GQA as [1, tokens, kv_heads, group, dim] with k/v expanded (no copy).
    q5 = q.reshape(1, -1, kv_heads, group, dim)
    k5 = k.reshape(1, -1, kv_heads, 1, dim).expand(-1, -1, -1, group, -1)
    v5 = v.reshape(1, -1, kv_heads, 1, dim).expand(-1, -1, -1, group, -1)
    out = memory_efficient_attention(q5, k5, v5, attn_bias=mask.extra, scale=scale)
    return out.reshape(batch, q_len, heads, dim)
