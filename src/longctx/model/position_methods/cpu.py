"""Pure-torch kernels for multi-pass position methods: the CPU default, any device.

Each pass's output and log-sum-exp over all queries, then one merge (plan.py). A pass
that is a fixed distance band (string, rerope, self_extend) goes document by document
(`_band_pass`): the queries whose band reaches back to the document start are one causal
kernel call; the rest go in blocks of BAND_BLOCK queries, all blocks of a document one
batched call over overlapping strided key windows under one shared mask. Other passes
(DCA's chunk passes) go per query block: the keys every query of a block covers without
a mask, the edges with one. On CPU the kernel is torch's fused flash-attention op, which
also returns the log-sum-exp and handles GQA; elsewhere explicit fp32 math. Decoding (one
query per row): one kernel call per row and pass over the pass's contiguous key range,
then the same merge.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from longctx.batch import document_segments
from longctx.model.position_methods.plan import UNBOUNDED, PassPlan, PositionPlan
from longctx.model.position_methods.plan import merge as _merge
from longctx.model.rope import apply_rotary
from longctx.model.sinks import apply_sinks, attend_math, recording

MIN_BULK_FRACTION = 0.5
"""A query block attends its common keys unmasked in a call of their own only when they are
at least this fraction of its key span (each kernel call has a fixed cost)."""
KEY_ALIGNMENT = 64
"""Key spans handed to the CPU kernel are multiples of this many keys where possible."""
BAND_BLOCK = 256
"""Queries per block in a windowed pass of the pure-torch path (see `_band_pass`). torch's CPU
flash kernel runs 256-query blocks 1.1-1.7x faster than 128-query ones over the same queries,
b - 1 more keys per block included, for windows of 128 to 2,731 keys and heads of 32 to 128
(docs/benchmarks.md, "Measurements behind design choices"); 512 is slower again."""


@dataclass
class TorchLayout:
    """The pure-torch kernels' view of a batch."""

    block_size: int
    """Queries per block of a pass without a band (`_block_pass`)."""
    documents: list[_Document]
    """The documents with queries, for passes with a band (`_band_pass`); empty in decoding."""
    backend: str = "torch"


def torch_layout(document_ids: torch.Tensor, q_len: int, block_size: int, any_band: bool) -> TorchLayout:
    return TorchLayout(block_size, _documents(document_ids, q_len) if q_len > 1 and any_band else [])


def block_spans(pass_band, lower: torch.Tensor, upper: torch.Tensor, block_size: int, kv_len: int):
    """PassPlan.blocks for a pass: per-block key spans when the pass has no band, in prefill."""
    if pass_band is not None or lower.shape[1] <= 1:
        return []
    return _block_spans(lower, upper, block_size, kv_len)


@dataclass(frozen=True)
class KeySpans:
    """The keys one query block attends in one pass, as key-index ranges [start, end)."""

    bulk: tuple[int, int] | None
    """Keys every query of the block attends: no mask."""
    masked: tuple[tuple[int, int], ...]
    """Keys attended under a mask built from each query's [lower, upper]."""
    has_empty_rows: bool
    """Some query of the block covers no key in this pass."""


def _block_spans(lower: torch.Tensor, upper: torch.Tensor, block_size: int, kv_len: int) -> list[list[KeySpans | None]]:
    """Per row and query block: the keys its queries cover, as the bulk that every query
    covers (no mask) plus masked edges. Inside a long document lower/upper grow with the
    query, so the edges are about one block wide on each side of the bulk.

    The fused CPU kernel is slower per key on spans that are not a multiple of
    KEY_ALIGNMENT keys (docs/benchmarks.md), so the bulk is cut to a multiple and the edges are widened
    outwards into keys no query of the block covers (the mask removes them)."""
    batch, q_len = lower.shape
    blocks = -(-q_len // block_size)
    pad = blocks * block_size - q_len
    valid = (torch.arange(blocks * block_size, device=lower.device) < q_len).view(blocks, block_size)
    lower, upper = (torch.nn.functional.pad(t, (0, pad)).view(batch, blocks, block_size) for t in (lower, upper))
    covered = valid & (upper >= lower)
    first = torch.where(covered, lower, UNBOUNDED).amin(-1)
    end = torch.where(covered, upper, -UNBOUNDED).amax(-1) + 1
    common_first = torch.where(covered, lower, -UNBOUNDED).amax(-1)
    common_end = torch.where(covered, upper, UNBOUNDED).amin(-1) + 1
    has_empty = (valid & ~covered).any(-1)
    columns = (first, end, common_first, common_end, has_empty, covered.any(-1))
    return [
        [
            _spans(kv_len, *block[:-1]) if block[-1] else None
            for block in zip(*(column.tolist() for column in row), strict=True)
        ]
        for row in zip(*columns, strict=True)
    ]


def _spans(kv_len: int, first: int, end: int, common_first: int, common_end: int, has_empty: bool) -> KeySpans:
    bulk_len = max(common_end - common_first, 0) // KEY_ALIGNMENT * KEY_ALIGNMENT
    if bulk_len < MIN_BULK_FRACTION * (end - first):  # too few common keys to be worth a call of their own
        return KeySpans(None, (_widen(first, end, kv_len),), has_empty)
    bulk_end = common_first + bulk_len
    left = _widen(first, common_first, kv_len, up=False) if common_first > first else None
    right = _widen(bulk_end, end, kv_len, down=False) if end > bulk_end else None
    return KeySpans((common_first, bulk_end), tuple(edge for edge in (left, right) if edge), has_empty)


def _widen(start: int, end: int, kv_len: int, *, down: bool = True, up: bool = True) -> tuple[int, int]:
    """[start, end) grown towards a multiple of KEY_ALIGNMENT keys, downwards first where
    allowed, never below 0 or past kv_len. Callers allow only directions whose keys the
    block does not cover (never into the bulk)."""
    missing = -(end - start) % KEY_ALIGNMENT
    below = min(missing, start) if down else 0
    above = min(missing - below, kv_len - end) if up else 0
    return start - below, end + above


def torch_passes(
    queries: list[torch.Tensor],
    k: torch.Tensor,
    v: torch.Tensor,
    plan: PositionPlan,
    scale: float,
    sinks: torch.Tensor | None = None,
):
    """Attention output [B, Tq, H, D] of a multi-pass plan from each pass's rotated
    queries [B, Tq, H, D] and the keys (rotated by each pass's key rotation here unless
    the plan says they arrive rotated). `sinks` [H]: applied once to the merged softmax
    (out * sigmoid(lse - s_h), model/sinks.py). Prefill: every pass's output and
    log-sum-exp over all queries, then one merge across passes (and the sinks on the
    merged softmax)."""
    if plan.q_len == 1:
        return _decode_passes(queries, k, v, plan, scale, sinks)
    keys = [k if rotation is None else apply_rotary(k, *rotation) for rotation in plan.key_rotations]
    parts = []
    for pass_plan, query in zip(plan.passes, queries, strict=True):
        key = keys[pass_plan.key_rotation]
        if pass_plan.band is not None:
            parts.append(_band_pass(query, key, v, pass_plan.band, plan.layout.documents, scale))
        else:
            parts.append(_block_pass(query, key, v, pass_plan, plan.layout.block_size, scale))
    return _with_sinks(_merge(parts), sinks).to(v.dtype)


class _Document(NamedTuple):
    """One document of one row: where its keys lie and how many of them are queries."""

    row: int
    key_start: int
    """Index of its first key in the row."""
    keys: int
    queries: int
    """Its last `queries` keys are queries (all of them in prefill)."""


def _documents(document_ids: torch.Tensor, q_len: int) -> list[_Document]:
    starts, k_lengths, q_lengths = document_segments(document_ids, q_len)
    kv_len = document_ids.shape[1]
    return [
        _Document(start // kv_len, start % kv_len, keys, queries)
        for start, keys, queries in zip(starts.tolist(), k_lengths.tolist(), q_lengths.tolist(), strict=True)
        if queries > 0
    ]


def _with_sinks(merged: tuple[torch.Tensor, torch.Tensor], sinks: torch.Tensor | None) -> torch.Tensor:
    """The merged output [..., H, D] with the sink logits in its softmax's denominator."""
    out, lse = merged
    return out if sinks is None else apply_sinks(out, lse, sinks, head_dim=lse.dim() - 1)


def _band_pass(q, k, v, band: tuple[int, int | None], documents: list[_Document], scale: float):
    """One pass that covers key distances [nearest, farthest] of every query, document by
    document. With i a query's index in its document, it attends keys [max(0, i -
    farthest), i - nearest]; queries i < nearest attend nothing. Three regions:

    - i < farthest (all queries when farthest = inf): the band reaches the document start,
      so query i sees keys [0, i - nearest]: one causal square of these queries against
      the keys cut `nearest` short (plus, in chunked prefill, an unmasked rectangle of the
      keys before the chunk's first query).
    - then blocks of BAND_BLOCK queries: block [a, a + b) sees keys [a - farthest, a + b -
      nearest), w - 1 + b of them for a window of w = farthest - nearest + 1 distances,
      under one mask that is the same for every block. All blocks of a document are one
      batched kernel call over overlapping strided windows of the keys.
    - the last < BAND_BLOCK queries: one masked call.

    Kernel work: the causal square as torch computes it, plus T (w - 1 + b) for the
    blocks, b^2 more than the band's pairs per block. (Unmasked calls for the blocks'
    causal edges would not save work: the CPU kernel computes key spans up to 512 in full,
    masked or causal, and a mask costs ~5% per pair.)

    q [B, Tq, H, D], k/v [B, Tk, Hkv, D]. Returns output [B, Tq, H, D] and log-sum-exp
    [B, Tq, H] in fp32 (fp64 for fp64 inputs); queries the band misses get 0 and -inf."""
    nearest, farthest = band
    batch, q_len, heads, dim = q.shape
    merge_dtype = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(batch, q_len, heads, dim, dtype=merge_dtype, device=q.device)
    lse = torch.full((batch, q_len, heads), -math.inf, dtype=merge_dtype, device=q.device)
    offset = k.shape[1] - q_len
    block_mask = None if farthest is None else _window_mask(BAND_BLOCK, farthest - nearest + 1, q.device)
    for doc in documents:
        query_base = doc.key_start - offset  # index in q of the document's position 0

        def query(i: int, j: int, doc: _Document = doc, query_base: int = query_base) -> torch.Tensor:
            return q[doc.row, query_base + i : query_base + j]  # the queries with document index in [i, j)

        def key_value(i: int, j: int, doc: _Document = doc) -> tuple[torch.Tensor, torch.Tensor]:
            return k[doc.row, doc.key_start + i : doc.key_start + j], v[doc.row, doc.key_start + i : doc.key_start + j]

        def write(
            i: int, result: tuple[torch.Tensor, torch.Tensor], doc: _Document = doc, query_base: int = query_base
        ) -> None:
            rows = slice(query_base + i, query_base + i + result[0].shape[0])
            out[doc.row, rows], lse[doc.row, rows] = result

        first = max(doc.keys - doc.queries, nearest)
        if first >= doc.keys:
            continue
        reaching_start = doc.keys if farthest is None else min(doc.keys, farthest)
        if first < reaching_start:
            rows = query(first, reaching_start)[None]
            diagonal = _unsqueeze(key_value(first - nearest, reaching_start - nearest))
            parts = [_squeeze(_kernel(rows, *diagonal, scale, causal=True))]
            if first > nearest:  # chunked prefill: the keys before the chunk, seen by all its queries
                parts.append(_squeeze(_kernel(rows, *_unsqueeze(key_value(0, first - nearest)), scale)))
            write(first, _merge(parts))
        if farthest is None:  # every query reaches its document's start: covered above
            continue
        assert block_mask is not None  # built whenever farthest is set
        start = max(first, reaching_start)
        blocks = (doc.keys - start) // BAND_BLOCK
        end = start + blocks * BAND_BLOCK
        if blocks:
            rows = query(start, end).unflatten(0, (blocks, BAND_BLOCK))
            span = block_mask.shape[1]
            key_windows, value_windows = (
                t.unfold(0, span, BAND_BLOCK).permute(0, 3, 1, 2)
                for t in key_value(start - farthest, end - BAND_BLOCK - farthest + span)
            )
            block_out, block_lse = _kernel(rows, key_windows, value_windows, scale, allowed=block_mask)
            write(start, (block_out.flatten(0, 1), block_lse.flatten(0, 1)))
        if end < doc.keys:
            tail_keys = _unsqueeze(key_value(end - farthest, doc.keys - nearest))
            allowed = _window_mask(doc.keys - end, farthest - nearest + 1, q.device)
            write(end, _squeeze(_kernel(query(end, doc.keys)[None], *tail_keys, scale, allowed=allowed)))
    return out, lse


@functools.lru_cache(maxsize=32)
def _window_mask(queries: int, width: int, device: torch.device) -> torch.Tensor:
    """[queries, width - 1 + queries] boolean: query p sees keys [p, p + width - 1], the
    keys of a block of consecutive queries under a band of `width` distances. Cached: every
    layer of a forward (and every forward of one shape) asks for the same masks; callers
    never write to it."""
    query_index = torch.arange(queries, device=device)[:, None]
    key_index = torch.arange(width - 1 + queries, device=device)
    return (key_index >= query_index) & (key_index <= query_index + width - 1)


def _unsqueeze(tensors: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return tensors[0][None], tensors[1][None]


def _squeeze(result: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return result[0][0], result[1][0]


def _block_pass(q, k, v, pass_plan: PassPlan, block_size: int, scale: float):
    """One pass with per-query key ranges (DCA's chunk passes), queries in blocks of
    `block_size`: each block attends the keys all its queries cover without a mask and
    the edges around them with one (`_block_spans`). Same layout as `_band_pass`."""
    batch, q_len, heads, dim = q.shape
    merge_dtype = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(batch, q_len, heads, dim, dtype=merge_dtype, device=q.device)
    lse = torch.full((batch, q_len, heads), -math.inf, dtype=merge_dtype, device=q.device)
    for b in range(batch):
        for block, q_start in enumerate(range(0, q_len, block_size)):
            spans = pass_plan.blocks[b][block]
            if spans is None:
                continue
            rows = slice(q_start, min(q_start + block_size, q_len))
            query, key, value = q[b, rows][None], k[b], v[b]
            lower, upper = pass_plan.lower[b, rows], pass_plan.upper[b, rows]
            parts = []
            if spans.bulk is not None:
                start, end = spans.bulk
                empty = upper < lower if spans.has_empty_rows else None
                parts.append(
                    _empty_rows(_squeeze(_kernel(query, key[None, start:end], value[None, start:end], scale)), empty)
                )
            if spans.masked:
                key_index = torch.cat([torch.arange(start, end, device=v.device) for start, end in spans.masked])
                allowed = (key_index >= lower[:, None]) & (key_index <= upper[:, None])
                empty = _covered_count(lower, upper, spans.masked) == 0
                masked_k, masked_v = _gather_ranges(key, spans.masked), _gather_ranges(value, spans.masked)
                parts.append(
                    _empty_rows(_squeeze(_kernel(query, masked_k[None], masked_v[None], scale, allowed=allowed)), empty)
                )
            out[b, rows], lse[b, rows] = _merge(parts)
    return out, lse


def _decode_passes(
    queries: list[torch.Tensor],
    k: torch.Tensor,
    v: torch.Tensor,
    plan: PositionPlan,
    scale: float,
    sinks: torch.Tensor | None = None,
):
    """One query per row: each pass covers one contiguous key range, so a row takes one
    kernel call per pass over exactly that range, merged as everywhere else. Keys are
    rotated only in the ranges a pass reads (ReRoPE's window, say, rather than the whole
    cache). Scoring by hand (matmul, softmax, matmul per pass) ran no faster
    (docs/benchmarks.md); the kernel keeps one code path with prefill."""
    batch, _, heads, dim = queries[0].shape
    ranges = [list(zip(p.lower[:, 0].tolist(), p.upper[:, 0].tolist(), strict=True)) for p in plan.passes]
    out = torch.empty(batch, 1, heads, dim, dtype=v.dtype, device=v.device)
    for b in range(batch):
        parts = []
        for pass_plan, query, pass_ranges in zip(plan.passes, queries, ranges, strict=True):
            start, last = pass_ranges[b]
            if last < start:
                continue
            keys = k[b : b + 1, start : last + 1]
            rotation = plan.key_rotations[pass_plan.key_rotation]
            if rotation is not None:
                keys = apply_rotary(keys, *(t[b : b + 1, start : last + 1] for t in rotation))
            parts.append(_kernel(query[b : b + 1], keys, v[b : b + 1, start : last + 1], scale))
        out[b] = _with_sinks(_merge(parts), sinks)[0].to(v.dtype)
    return out


def _covered_count(lower: torch.Tensor, upper: torch.Tensor, ranges: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """For each query, how many keys of the index ranges [start, end) lie in [lower, upper]."""
    count = torch.zeros_like(lower)
    for start, end in ranges:
        count += (torch.minimum(upper, torch.full_like(upper, end - 1)) - torch.clamp(lower, min=start) + 1).clamp(
            min=0
        )
    return count


def _gather_ranges(x: torch.Tensor, ranges: tuple[tuple[int, int], ...]) -> torch.Tensor:
    if len(ranges) == 1:
        return x[ranges[0][0] : ranges[0][1]]
    return torch.cat([x[start:end] for start, end in ranges])


def _kernel(q, k, v, scale: float, *, causal: bool = False, allowed: torch.Tensor | None = None):
    """Softmax attention of q [N, Tq, H, D] over k/v [N, Tk, Hkv, D] (query head h reads
    key head h // (H / Hkv)); causal: query t sees keys <= t (top-left aligned); allowed:
    a [Tq, Tk] boolean mask. Every query must see some key. Returns the output [N, Tq, H, D]
    and log-sum-exp [N, Tq, H] in fp32 (fp64 for fp64 inputs). On CPU without autograd this
    is torch's fused flash kernel, which skips the masked half of a causal square; with
    autograd recording, and elsewhere, explicit math (sinks.attend_math): the fused kernel's
    backward drops the log-sum-exp's gradient, which the merge of passes needs (without it
    q and k gradients are off by ~10-30% at a few hundred tokens)."""
    q4, k4, v4 = (t.transpose(1, 2) for t in (q, k, v))
    bias = None
    if allowed is not None:
        bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, -math.inf)
    if q.device.type == "cpu" and not recording(q, k, v):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q4, k4, v4, 0.0, causal, attn_mask=bias, scale=scale
        )
    else:
        out, lse = attend_math(q4, k4, v4, bias, causal, scale)
    merge_dtype = torch.promote_types(q.dtype, torch.float32)
    return out.transpose(1, 2).to(merge_dtype), lse.transpose(1, 2).to(merge_dtype)


def _empty_rows(
    result: tuple[torch.Tensor, torch.Tensor], empty: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output 0 and log-sum-exp -inf for the queries flagged in `empty` [Tq] (they saw
    only masked keys, which the kernel does not report)."""
    out, lse = result
    if empty is None or not bool(empty.any()):
        return out, lse
    return out.masked_fill(empty[:, None, None], 0.0), lse.masked_fill(empty[:, None], -math.inf)
