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

DCA's passes cover whole position chunks of s tokens (plan.AttentionPass.chunk): each
(document, query chunk) is one segment of gathered queries against gathered keys: its
own chunk up to the query (causal), the previous chunk, or all chunks before that (no
mask). The last relation gathers O(T^2 / s) keys in all, so its segments are split into
calls of at most KEYS_PER_CALL gathered keys (at least one segment each).

Backward: torch's varlen_attn (2.11 and 2.14) registers a backward that drops the
gradient of the lse, which the merge needs (a pass's weight in the merge is a function of
its lse). So when autograd records, each call's lse gets the missing term back exactly
(`_lse_with_gradient`): d lse_i / d q_i = s sum_j P_ij k_j and d lse_i / d k_j = s P_ij q_i
(s the softmax scale, P the call's attention weights), both read off one more kernel call
that attends with the keys as values.

No [T, T] tensor exists anywhere: memory is O(T) per call. Decoding with a KV cache (one
query per row) is the same layout with one query per document.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from longctx.batch import cu_seqlens, document_segments
from longctx.model.flash import VarlenKernel, resolve_kernel, varlen_flash
from longctx.model.position_methods.plan import PositionPlan, merge

KEYS_PER_CALL = 1 << 21
"""Most gathered keys per kernel call of a chunk pass (DCA's earlier-chunks relation)."""


@dataclass
class VarlenCall:
    """One kernel call: which queries and keys it gathers, their segments, the window."""

    query_index: torch.Tensor | None
    """Flat index (row * Tq + query) of every query in segment order; None = all, in order."""
    cu_seqlens_q: torch.Tensor
    max_seqlen_q: int
    key_index: torch.Tensor
    """Flat index (row * Tk + key) of every key in segment order."""
    cu_seqlens_k: torch.Tensor
    max_seqlen_k: int
    """Computed once per batch: the kernel needs host ints, read here, not per layer."""
    window: tuple[int, int]


@dataclass
class VarlenLayout:
    """The varlen kernel's view of a batch: each pass's calls."""

    calls: list[list[VarlenCall]]
    kernel: VarlenKernel
    """Chosen once per batch (model/flash.py)."""
    backend: str = "flash"


def varlen_layout(position_ids: torch.Tensor, document_ids: torch.Tensor, q_len: int, passes: list) -> VarlenLayout:
    """Per-batch layout for passes that each have a band or a chunk relation (plan.AttentionPass)."""
    starts, k_lengths, q_lengths = document_segments(document_ids, q_len)
    calls = []
    for attention_pass in passes:
        if attention_pass.band is not None:
            calls.append([_band_call(starts, k_lengths, q_lengths, attention_pass.band)])
        else:
            calls.append(_chunk_calls(position_ids, starts, k_lengths, q_lengths, q_len, attention_pass.chunk))
    return VarlenLayout(calls, resolve_kernel())


def _band_call(starts, k_lengths, q_lengths, band: tuple[int, int | None]) -> VarlenCall:
    """All queries in order against each document's keys but its last `nearest` ones."""
    nearest, farthest = band
    kept = (k_lengths - nearest).clamp(min=0)
    total = int(kept.sum())
    first = torch.repeat_interleave(starts, kept, output_size=total)
    before = torch.repeat_interleave(kept.cumsum(0) - kept, kept, output_size=total)
    key_index = first + torch.arange(total, device=kept.device) - before
    max_q, max_k = torch.stack([q_lengths.max(), kept.max()]).tolist()
    window = (-1 if farthest is None else farthest - nearest, 0)
    return VarlenCall(None, cu_seqlens(q_lengths), max_q, key_index, cu_seqlens(kept), max_k, window)


def _chunk_calls(position_ids, starts, k_lengths, q_lengths, q_len: int, chunk: tuple[int, int]) -> list[VarlenCall]:
    """Segments (document, query chunk c) of a chunk pass, grouped into calls (module docstring)."""
    size, relation = chunk
    kv_len = position_ids.shape[1]
    first_positions = position_ids.flatten()[starts]
    segments = []  # (query flat start, query count, key flat start, key count)
    for start, keys, queries, p0 in zip(
        starts.tolist(), k_lengths.tolist(), q_lengths.tolist(), first_positions.tolist(), strict=True
    ):
        if queries == 0:
            continue
        row, local = divmod(start, kv_len)
        query_base = row * q_len + local - (kv_len - q_len)  # flat query index of the document's key 0
        for c in range((p0 + keys - queries) // size, (p0 + keys - 1) // size + 1):
            low, high = max(0, c * size - p0), min(keys, (c + 1) * size - p0)
            query_low = max(keys - queries, low)
            key_range = {0: (low, high), 1: (max(0, (c - 1) * size - p0), low), 2: (0, max(0, (c - 1) * size - p0))}[
                relation
            ]
            if key_range[1] > key_range[0]:
                segments.append(
                    (query_base + query_low, high - query_low, start + key_range[0], key_range[1] - key_range[0])
                )
    window = (-1, 0) if relation == 0 else (-1, -1)
    calls: list[VarlenCall] = []
    group: list[tuple[int, int, int, int]] = []
    group_keys = 0
    for segment in segments:
        if group and group_keys + segment[3] > KEYS_PER_CALL:
            calls.append(_gathered_call(group, window, position_ids.device))
            group, group_keys = [], 0
        group.append(segment)
        group_keys += segment[3]
    if group:
        calls.append(_gathered_call(group, window, position_ids.device))
    return calls


def _gathered_call(segments: list[tuple[int, int, int, int]], window: tuple[int, int], device) -> VarlenCall:
    def ranges(first: list[int], count: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.tensor(count, device=device)
        total = sum(count)
        base = torch.repeat_interleave(
            torch.tensor(first, device=device) - (lengths.cumsum(0) - lengths), lengths, output_size=total
        )
        return base + torch.arange(total, device=device), lengths

    query_first, query_count, key_first, key_count = (list(column) for column in zip(*segments, strict=True))
    query_index, query_lengths = ranges(query_first, query_count)
    key_index, key_lengths = ranges(key_first, key_count)
    return VarlenCall(
        query_index,
        cu_seqlens(query_lengths),
        max(query_count),
        key_index,
        cu_seqlens(key_lengths),
        max(key_count),
        window,
    )


def varlen_passes(
    queries: list[torch.Tensor], keys: list[torch.Tensor], v: torch.Tensor, plan: PositionPlan, scale: float
):
    """Attention output [B, Tq, H, D] of a band/chunk-pass plan: the passes' kernel calls, merged."""
    layout: VarlenLayout = plan.layout
    batch, q_len, heads, dim = queries[0].shape
    kv_heads = v.shape[2]
    flat_v = v.reshape(-1, kv_heads, dim)
    merge_dtype = torch.promote_types(v.dtype, torch.float32)
    parts = []
    for pass_plan, q_rot, calls in zip(plan.passes, queries, layout.calls, strict=True):
        flat_q = q_rot.reshape(-1, heads, dim)
        flat_k = keys[pass_plan.key_rotation].reshape(-1, kv_heads, dim)
        out = torch.zeros(batch * q_len, heads, dim, dtype=merge_dtype, device=v.device)
        lse = torch.full((batch * q_len, heads), -math.inf, dtype=merge_dtype, device=v.device)
        for call in calls:
            if call.max_seqlen_k == 0:  # every document is shorter than the band's `nearest`
                continue
            call_q = flat_q if call.query_index is None else flat_q[call.query_index]
            call_k = flat_k[call.key_index]
            call_out, call_lse = varlen_flash(
                call_q,
                call_k,
                flat_v[call.key_index],
                call.cu_seqlens_q,
                call.cu_seqlens_k,
                call.max_seqlen_q,
                call.max_seqlen_k,
                scale=scale,
                window=call.window,
                lse=True,
                kernel=layout.kernel,
            )
            if call_lse is None or call_lse.shape != (heads, call_out.shape[0]):
                raise RuntimeError(
                    f"the varlen kernel returned a log-sum-exp of shape {getattr(call_lse, 'shape', None)}, expected "
                    f"{(heads, call_out.shape[0])} (flash-attn >= 2.5 or torch >= 2.11)"
                )
            call_lse = call_lse.transpose(0, 1).to(merge_dtype)
            if torch.is_grad_enabled() and (call_q.requires_grad or call_k.requires_grad):
                call_lse = _lse_with_gradient(call_lse, call_q, call_k, call, scale, layout.kernel)
            if call.query_index is None:
                out, lse = call_out.to(merge_dtype), call_lse
            else:
                out[call.query_index], lse[call.query_index] = call_out.to(merge_dtype), call_lse
        empty = (pass_plan.upper < pass_plan.lower).reshape(-1, 1)  # the kernel's value for these varies
        parts.append((out.masked_fill(empty[..., None], 0.0), lse.masked_fill(empty, -math.inf)))
    return merge(parts)[0].view(batch, q_len, heads, dim).to(v.dtype)


def _lse_with_gradient(
    lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor, call: VarlenCall, scale: float, kernel: VarlenKernel
) -> torch.Tensor:
    """lse [Nq, H] (from the kernel, whose backward ignores it) plus a term of value exactly 0
    whose gradient is d lse / d (q, k). With A_i = sum_j P_ij k_j, the output of the call
    with the keys as values: f_i = s (q_i . sg(A_i) + sg(q_i) . A_i), where the second A_i
    is differentiable in the value slot only (q, k detached in the score slots), so
    df_i / dq_i = s A_i and df_i / dk_j = s P_ij q_i; f - sg(f) is 0 (sg: stop-gradient)."""
    keys_as_values, _ = varlen_flash(
        q.detach(),
        k.detach(),
        k,
        call.cu_seqlens_q,
        call.cu_seqlens_k,
        call.max_seqlen_q,
        call.max_seqlen_k,
        scale=scale,
        window=call.window,
        kernel=kernel,
    )
    mean_key = keys_as_values.to(lse.dtype)
    wide_q = q.to(lse.dtype)
    term = scale * ((wide_q * mean_key.detach()).sum(-1) + (wide_q.detach() * mean_key).sum(-1))
    return lse + (term - term.detach())
