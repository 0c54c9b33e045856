"""Band passes on the varlen FlashAttention kernel (CUDA): StRing, ReRoPE, Self-Extend, DCA.

Every pass of these methods whose key distances form one band [nearest, farthest] for all
queries is one call of `model.flash.varlen_flash` over the documents of the whole batch
laid end to end (STRING Algorithm 1 does the same with flash-attn):

- keys: each document's keys with its last `nearest` dropped (a gather, O(T) memory).
  The kernel's bottom-right causal alignment then ends query m of the document at key
  m - nearest;
- window (farthest - nearest, 0): the query reaches back to key m - farthest (-1 when
  the band has no far end);
- the kernel returns each query's log-sum-exp, and `plan.merge` combines the passes in
  fp32. Queries a pass does not reach (documents shorter than `nearest`) are masked to
  output 0, lse -inf here, whatever the kernel reports for them.

No [T, T] tensor exists anywhere: memory is O(T) per pass. Decoding with a KV cache (one
query per row) is the same call with one query per document. DCA's chunk passes have no
fixed band and use the pure-torch kernels (cpu.py) on every device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from longctx.batch import cu_seqlens, document_segments
from longctx.model.flash import varlen_flash
from longctx.model.position_methods.plan import PositionPlan, merge


@dataclass
class VarlenQueries:
    """Queries of all rows, document by document, in the kernel's varlen layout."""

    cu_seqlens: torch.Tensor
    max_seqlen: int
    """Computed once per batch: the kernel needs a host int, read here, not per layer."""


@dataclass
class VarlenKeys:
    """One pass's keys: each document's keys but its last `nearest` ones, laid end to end."""

    cu_seqlens: torch.Tensor
    key_index: torch.Tensor
    """Flat index (row * Tk + key) of every kept key."""
    max_seqlen: int


@dataclass
class VarlenLayout:
    """The varlen kernel's view of a batch: the queries, and each pass's keys."""

    queries: VarlenQueries
    keys: list[VarlenKeys]
    backend: str = "flash"


def varlen_layout(document_ids: torch.Tensor, q_len: int, bands: list[tuple[int, int | None]]) -> VarlenLayout:
    """Per-batch layout for passes with the given (nearest, farthest) bands."""
    starts, k_lengths, q_lengths = document_segments(document_ids, q_len)
    queries = VarlenQueries(cu_seqlens(q_lengths), int(q_lengths.max()))
    return VarlenLayout(queries, [_cut_keys(starts, k_lengths, nearest) for nearest, _ in bands])


def _cut_keys(starts: torch.Tensor, k_lengths: torch.Tensor, nearest: int) -> VarlenKeys:
    """Each document's keys with its last `nearest` dropped."""
    kept = (k_lengths - nearest).clamp(min=0)
    total = int(kept.sum())
    first = torch.repeat_interleave(starts, kept, output_size=total)
    before = torch.repeat_interleave(kept.cumsum(0) - kept, kept, output_size=total)
    key_index = first + torch.arange(total, device=kept.device) - before
    return VarlenKeys(cu_seqlens(kept), key_index, int(kept.max()))


def varlen_passes(queries: list[torch.Tensor], keys: list[torch.Tensor], v: torch.Tensor, plan: PositionPlan, scale: float):
    """Attention output [B, Tq, H, D] of a band-pass plan: one kernel call per pass, merged."""
    layout: VarlenLayout = plan.layout
    batch, q_len, heads, dim = queries[0].shape
    kv_heads = v.shape[2]
    flat_v = v.reshape(-1, kv_heads, dim)
    merge_dtype = torch.promote_types(v.dtype, torch.float32)
    parts = []
    for pass_plan, q_rot, pass_keys in zip(plan.passes, queries, layout.keys, strict=True):
        nearest, farthest = pass_plan.band
        if pass_keys.max_seqlen == 0:  # every document is shorter than `nearest`: nothing to attend
            continue
        flat_k = keys[pass_plan.key_rotation].reshape(-1, kv_heads, dim)
        out, lse = varlen_flash(
            q_rot.reshape(-1, heads, dim),
            flat_k[pass_keys.key_index],
            flat_v[pass_keys.key_index],
            layout.queries.cu_seqlens,
            pass_keys.cu_seqlens,
            layout.queries.max_seqlen,
            pass_keys.max_seqlen,
            scale=scale,
            window=(-1 if farthest is None else farthest - nearest, 0),
            lse=True,
        )
        if lse.shape != (heads, out.shape[0]):
            raise RuntimeError(
                f"the varlen kernel returned a log-sum-exp of shape {tuple(lse.shape)}, expected {(heads, out.shape[0])} "
                "(flash-attn >= 2.5 or torch >= 2.11)"
            )
        empty = (pass_plan.upper < pass_plan.lower).reshape(-1, 1)
        out = out.to(merge_dtype).masked_fill(empty[..., None], 0.0)
        parts.append((out, lse.transpose(0, 1).to(merge_dtype).masked_fill(empty, -math.inf)))
    return merge(parts)[0].view(batch, q_len, heads, dim).to(v.dtype)
