"""Band passes on the varlen FlashAttention kernel (CUDA): StRing, ReRoPE, Self-Extend, DCA.

Every pass of these methods whose key distances form one band [nearest, farthest] for all
queries is one call of `model.flash.varlen_flash` over the documents of the whole batch
laid end to end (STRING Algorithm 1 does the same with flash-attn):

- keys: each document's keys but its last `nearest`. The kernel's bottom-right causal
  alignment then ends the document's query m at key m - nearest;
- queries: the queries that see some key (document index >= nearest) when these are one
  contiguous run (one document per batch, as in NIAH; every document when nearest = 0);
  else all queries, the others (document index < nearest) output 0 with lse -inf,
  whatever the kernel reports for them (`VarlenCall.empty_queries`);
- window (farthest - nearest, 0): the query reaches back to key m - farthest (-1 when
  the band has no far end).

A call's queries and keys are slices of the flattened batch where they are contiguous (in
a prefill: for nearest = 0, and for every band with one document per batch), else gathered.

DCA's passes cover whole position chunks of s tokens (plan.AttentionPass.chunk): each
(document, query chunk) is one segment of queries against keys: its own chunk up to the
query (causal), the previous chunk, or all chunks before that (no mask). The last relation
gathers O(T^2 / s) keys in all, so its segments are split into calls of at most
KEYS_PER_CALL gathered keys (at least one segment each).

Merge (`_merge_into`): the first pass's output, when its call covers every query, becomes
the accumulator as the kernel returned it (in q's dtype, lse [H, Nq] in fp32); each further
call folds in with out += w (out_call - out), w = sigmoid(lse_call - lse) = the call's share
of the two softmaxes, and lse = logaddexp(lse, lse_call): STRING Algorithm 2, one fused
`lerp` over the call's rows, in place when autograd does not record (out of place when it
does: the kernel saved its output for backward). Only the [H, Nq] log-sum-exps and weights
are fp32; the weight is rounded to q's dtype for `lerp` (bf16: one rounding more than the
fp32 formula, tests/model/test_flash.py). GQA: when the kernel takes no GQA (torch 2.11's
signature, `flash.kv_repeats`), keys and values are expanded once per layer here, shared
by every pass, rather than once per kernel call.

Backward: torch's varlen_attn (2.11 and 2.14) registers a backward that drops the
gradient of the lse, which the merge needs (a pass's weight in the merge is a function of
its lse). So when autograd records, each call's lse gets the missing term back exactly,
read off one more kernel call that attends with the keys as values (model/sinks.py's
`lse_with_gradient`, which states the formula).

No [T, T] tensor exists anywhere: memory is O(T) per call. Decoding with a KV cache (one
query per row) is the same layout with one query per document.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from longctx.batch import document_segments
from longctx.model.flash import VarlenKernel, kv_repeats, resolve_kernel, varlen_flash
from longctx.model.position_methods.plan import PositionPlan
from longctx.model.sinks import apply_sinks, lse_with_gradient

KEYS_PER_CALL = 1 << 21
"""Most gathered keys per kernel call of a chunk pass (DCA's earlier-chunks relation)."""

Rows = slice | torch.Tensor
"""Rows of a flattened [B * T, ...] tensor: a slice where they are contiguous, else their
flat indices (a gather)."""


@dataclass
class VarlenCall:
    """One kernel call: its queries and keys, their segments, the window."""

    queries: Rows
    """Rows of the flattened [B * Tq] queries, in segment order."""
    cu_seqlens_q: torch.Tensor
    max_seqlen_q: int
    keys: Rows
    """Rows of the flattened [B * Tk] keys, in segment order."""
    cu_seqlens_k: torch.Tensor
    max_seqlen_k: int
    """Computed once per batch: the kernel needs host ints, read here, not per layer."""
    window: tuple[int, int]
    empty_queries: torch.Tensor | None = None
    """Indices (into the call's queries) of those that see no key, or None."""

    def attend(self, q, k, v, *, scale: float, kernel: VarlenKernel, lse: bool = False):
        """`varlen_flash` on this call's gathered q, k, v: (out, lse or None)."""
        cu_q, cu_k, max_q, max_k = self.cu_seqlens_q, self.cu_seqlens_k, self.max_seqlen_q, self.max_seqlen_k
        return varlen_flash(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window=self.window, lse=lse, kernel=kernel)


@dataclass
class VarlenLayout:
    """The varlen kernel's view of a batch: each pass's calls."""

    calls: list[list[VarlenCall]]
    kernel: VarlenKernel
    """Chosen once per batch (model/flash.py)."""
    backend: str = "flash"


@dataclass(frozen=True)
class _Document:
    """One document with queries, flat indices into the batch laid end to end."""

    key_start: int
    keys: int
    query_start: int
    """Flat index (row * Tq + query) of its first query; its queries are its last keys."""
    queries: int
    first_position: int


Segment = tuple[int, int, int, int]
"""(first query, query count, first key, key count), flat indices."""


def varlen_layout(position_ids: torch.Tensor, document_ids: torch.Tensor, q_len: int, passes: list) -> VarlenLayout:
    """Per-batch layout for passes that each have a band or a chunk relation (plan.AttentionPass)."""
    starts, k_lengths, q_lengths = document_segments(document_ids, q_len)
    kv_len = position_ids.shape[1]
    columns = torch.stack([starts, k_lengths, q_lengths, position_ids.flatten()[starts]]).tolist()
    documents = [
        _Document(
            start, keys, (start // kv_len) * q_len + start % kv_len + keys - queries - (kv_len - q_len), queries, p0
        )
        for start, keys, queries, p0 in zip(*columns, strict=True)
        if queries > 0
    ]
    device = position_ids.device
    calls = [
        _band_calls(documents, p.band, device) if p.band is not None else _chunk_calls(documents, p.chunk, device)
        for p in passes
    ]
    return VarlenLayout(calls, resolve_kernel())


def _band_calls(documents: list[_Document], band: tuple[int, int | None], device) -> list[VarlenCall]:
    """One call: each document's keys but its last `nearest` ones, against its queries that
    see some key if these form one run, else against all queries (module docstring)."""
    nearest, farthest = band
    window = (-1 if farthest is None else farthest - nearest, 0)
    seeing = []  # segments of the queries that see some key
    for doc in documents:
        first_seeing = max(nearest, doc.keys - doc.queries)  # document index of the first such query
        if first_seeing < doc.keys:
            query_first = doc.query_start + first_seeing - (doc.keys - doc.queries)
            seeing.append((query_first, doc.keys - first_seeing, doc.key_start, doc.keys - nearest))
    if not seeing:
        return []
    if _contiguous([(first, count) for first, count, _, _ in seeing]):
        return [_call(seeing, window, device)]
    every = [(doc.query_start, doc.queries, doc.key_start, max(0, doc.keys - nearest)) for doc in documents]
    first = every[0][0]  # the call's queries are all queries, from the first document's on
    empty = [
        (doc.query_start - first, min(doc.queries, nearest - (doc.keys - doc.queries)))
        for doc in documents
        if nearest > doc.keys - doc.queries
    ]
    call = _call(every, window, device)
    call.empty_queries = _indices(empty, device)
    return [call]


def _chunk_calls(documents: list[_Document], chunk: tuple[int, int], device) -> list[VarlenCall]:
    """Segments (document, query chunk c) of a chunk pass, grouped into calls (module docstring)."""
    size, relation = chunk
    segments: list[Segment] = []
    for doc in documents:
        p0, keys, queries = doc.first_position, doc.keys, doc.queries
        query_base = doc.query_start - (keys - queries)  # flat query index of the document's key 0
        for c in range((p0 + keys - queries) // size, (p0 + keys - 1) // size + 1):
            low, high = max(0, c * size - p0), min(keys, (c + 1) * size - p0)
            query_low = max(keys - queries, low)
            previous = max(0, (c - 1) * size - p0)  # the document index of chunk c - 1's first key
            key_low, key_high = {0: (low, high), 1: (previous, low), 2: (0, previous)}[relation]
            if key_high > key_low:
                segments.append((query_base + query_low, high - query_low, doc.key_start + key_low, key_high - key_low))
    window = (-1, 0) if relation == 0 else (-1, -1)
    calls: list[VarlenCall] = []
    group: list[Segment] = []
    group_keys = 0
    for segment in segments:
        if group and group_keys + segment[3] > KEYS_PER_CALL:
            calls.append(_call(group, window, device))
            group, group_keys = [], 0
        group.append(segment)
        group_keys += segment[3]
    if group:
        calls.append(_call(group, window, device))
    return calls


def _call(segments: list[Segment], window: tuple[int, int], device) -> VarlenCall:
    query_ranges = [(first, count) for first, count, _, _ in segments]
    key_ranges = [(first, count) for _, _, first, count in segments]

    def cu_seqlens(ranges: list[tuple[int, int]]) -> torch.Tensor:  # batch.cu_seqlens, from host ints
        return torch.tensor([0, *itertools.accumulate(count for _, count in ranges)], dtype=torch.int32, device=device)

    return VarlenCall(
        _rows(query_ranges, device),
        cu_seqlens(query_ranges),
        max(count for _, count in query_ranges),
        _rows(key_ranges, device),
        cu_seqlens(key_ranges),
        max(count for _, count in key_ranges),
        window,
    )


def _contiguous(ranges: list[tuple[int, int]]) -> bool:
    """Whether the ranges (first, count) follow each other without a gap."""
    return all(first + count == following for (first, count), (following, _) in itertools.pairwise(ranges))


def _rows(ranges: list[tuple[int, int]], device) -> Rows:
    """The rows of the ranges (first, count) in order: a slice if they follow each other."""
    if _contiguous(ranges):
        return slice(ranges[0][0], ranges[0][0] + sum(count for _, count in ranges))
    return _indices(ranges, device)


def _indices(ranges: list[tuple[int, int]], device) -> torch.Tensor:
    """Flat indices of the ranges (first, count), in order."""
    lengths = torch.tensor([count for _, count in ranges], device=device)
    total = sum(count for _, count in ranges)
    base = torch.repeat_interleave(
        torch.tensor([first for first, _ in ranges], device=device) - (lengths.cumsum(0) - lengths),
        lengths,
        output_size=total,
    )
    return base + torch.arange(total, device=device)


def varlen_passes(
    queries: list[torch.Tensor],
    keys: list[torch.Tensor],
    v: torch.Tensor,
    plan: PositionPlan,
    scale: float,
    sinks: torch.Tensor | None = None,
):
    """Attention output [B, Tq, H, D] of a band/chunk-pass plan: the passes' kernel calls,
    merged into one accumulator as they come (module docstring); `sinks` [H] join the
    merged softmax once (out * sigmoid(lse - s_h), model/sinks.py)."""
    layout: VarlenLayout = plan.layout
    batch, q_len, heads, dim = queries[0].shape
    kv_heads = v.shape[2]
    repeats = kv_repeats(layout.kernel, heads, kv_heads)

    def flat_kv(t: torch.Tensor) -> torch.Tensor:  # [B * Tk, H or Hkv, D], expanded once for every pass
        flat = t.reshape(-1, kv_heads, dim)
        return flat if repeats == 1 else flat.repeat_interleave(repeats, dim=1)

    flat_v = flat_kv(v)
    flat_keys: dict[int, torch.Tensor] = {}
    lse_dtype = torch.promote_types(v.dtype, torch.float32)
    recording = torch.is_grad_enabled() and any(t.requires_grad for t in (*queries, *keys, v))
    merged: tuple[torch.Tensor, torch.Tensor] | None = None
    for pass_plan, q_rot, calls in zip(plan.passes, queries, layout.calls, strict=True):
        flat_q = q_rot.reshape(-1, heads, dim)
        if pass_plan.key_rotation not in flat_keys:
            flat_keys[pass_plan.key_rotation] = flat_kv(keys[pass_plan.key_rotation])
        flat_k = flat_keys[pass_plan.key_rotation]
        for call in calls:
            if call.max_seqlen_k == 0:  # every document is shorter than the band's `nearest`
                continue
            call_q, call_k = flat_q[call.queries], flat_k[call.keys]
            call_out, call_lse = call.attend(
                call_q, call_k, flat_v[call.keys], scale=scale, kernel=layout.kernel, lse=True
            )
            if call_lse is None or call_lse.shape != (heads, call_out.shape[0]):
                raise RuntimeError(
                    f"the varlen kernel returned a log-sum-exp of shape {getattr(call_lse, 'shape', None)}, expected "
                    f"{(heads, call_out.shape[0])} (flash-attn >= 2.5 or torch >= 2.11)"
                )
            call_lse = call_lse.to(lse_dtype)
            if recording and (call_q.requires_grad or call_k.requires_grad):

                def attend(query, key, values, call: VarlenCall = call) -> torch.Tensor:
                    return call.attend(query, key, values, scale=scale, kernel=layout.kernel)[0]

                call_lse = lse_with_gradient(call_lse.t(), call_q, call_k, attend, scale).t()
            if call.empty_queries is not None:  # the kernel's values for these vary
                if recording:
                    call_out = call_out.index_fill(0, call.empty_queries, 0.0)
                    call_lse = call_lse.index_fill(1, call.empty_queries, -math.inf)
                else:
                    call_out.index_fill_(0, call.empty_queries, 0.0)
                    call_lse.index_fill_(1, call.empty_queries, -math.inf)
            merged = _merge_into(merged, call_out, call_lse, call.queries, batch * q_len, recording)
    if merged is None:
        return v.new_zeros(batch, q_len, heads, dim)
    out = merged[0] if sinks is None else apply_sinks(merged[0], merged[1].t(), sinks, head_dim=1)
    return out.view(batch, q_len, heads, dim)


def _merge_into(
    merged: tuple[torch.Tensor, torch.Tensor] | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    rows: Rows,
    total: int,
    recording: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The accumulator (output [N, H, D], lse [H, N]) with one call's output [n, H, D] and
    lse [H, n] folded into `rows` (STRING Algorithm 2, module docstring). The first call
    that covers all N rows is the accumulator itself; rows no call has covered yet hold
    output 0 and lse -inf (weight 0). In place unless `recording`."""
    if merged is None:
        if isinstance(rows, slice) and (rows.start, rows.stop) == (0, total):
            return out, lse
        merged = out.new_zeros((total, *out.shape[1:])), lse.new_full((lse.shape[0], total), -math.inf)
    merged_out, merged_lse = merged
    old_out, old_lse = merged_out[rows], merged_lse[:, rows]
    share = torch.sigmoid(lse - old_lse).nan_to_num(0.0)  # nan: neither side covers the query (-inf - -inf)
    weight = share.t().to(out.dtype, memory_format=torch.contiguous_format)[..., None]
    if recording:
        new_out, new_lse = torch.lerp(old_out, out, weight), torch.logaddexp(old_lse, lse)
        if isinstance(rows, torch.Tensor):
            return merged_out.index_copy(0, rows, new_out), merged_lse.index_copy(1, rows, new_lse)
        if (rows.start, rows.stop) == (0, total):
            return new_out, new_lse
        return (
            merged_out.slice_scatter(new_out, 0, rows.start, rows.stop),
            merged_lse.slice_scatter(new_lse, 1, rows.start, rows.stop),
        )
    old_out.lerp_(out, weight)
    torch.logaddexp(old_lse, lse, out=old_lse)
    if isinstance(rows, torch.Tensor):  # old_out and old_lse are gathered copies
        merged_out.index_copy_(0, rows, old_out)
        merged_lse.index_copy_(1, rows, old_lse)
    return merged_out, merged_lse
