"""Attention as a list of passes: planning and computing them (torch and flash-attn paths).

A position method (position_methods.py) is a list of *passes*: a pass covers, for every
query, a contiguous range of key distances m - n inside the query's document and rotates
queries and keys at its own RoPE indices. A query's output is the softmax over the union
of its passes, obtained by merging each pass's output with its log-sum-exp in fp32:

    lse = logaddexp(lse_a, lse_b),   out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b

(= sigmoid(lse_a - lse_b) out_a + sigmoid(lse_b - lse_a) out_b, STRING Algorithm 2; a
pass that covers no key of a query has lse = -inf and weight 0).

    plan = make_plan(method, position_ids, document_ids, q_len)   # once per forward
    out = attend_passes(rotated_queries, k, v, plan, scale)        # every layer

Implementations:

- pure torch (any device, the CPU default): each pass's output and log-sum-exp over all
  queries, then one merge. A pass that is a fixed distance band (string, rerope,
  self_extend) goes document by document (`_band_pass`): the queries whose band reaches
  back to the document start are one causal kernel call; the rest go in blocks of
  BAND_BLOCK queries, all blocks of a document one batched call over overlapping strided
  key windows under one shared mask. Other passes (DCA's chunk passes) go per query
  block: the keys every query of a block covers without a mask, the edges with one. On
  CPU the kernel is torch's fused flash-attention op, which also returns the log-sum-exp
  and handles GQA; elsewhere explicit fp32 math. Decoding (one query per row): one kernel
  call per row and pass over the pass's contiguous key range, then the same merge.
- flash (CUDA, `gpu` extra) for methods whose passes are fixed distance bands (string,
  rerope, self_extend): per pass one `flash_attn_varlen_func` over the documents, with the
  keys of each document cut `nearest` tokens short (flash's bottom-right causal mask then
  ends each query at m - nearest) and window (farthest - nearest, 0). DCA always uses the
  pure-torch path. rope/ntk/yarn call `attention()` with the chosen backend.

Position ids must increase by one inside a document (evaluation positions always do), so
a key's distance is its index distance; a plan checks this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from longctx.batch import document_segments, document_start_index
from longctx.model.attention import AttentionMask, build_mask, resolve_backend
from longctx.model.rope import RotaryEmbedding, apply_rotary

UNBOUNDED = 1 << 40
"""Largest key distance of a pass without a far end."""
MIN_BULK_FRACTION = 0.5
"""A query block attends its common keys unmasked in a call of their own only when they are
at least this fraction of its key span (each kernel call costs ~0.6 ms fixed at 256 queries)."""
KEY_ALIGNMENT = 64
"""Key spans handed to the CPU kernel are multiples of this many keys where possible."""
BAND_BLOCK = 128
"""Queries per block in a windowed pass of the pure-torch path (see `_band_pass`)."""


# --- passes ------------------------------------------------------------------------------

PositionMap = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class AttentionPass:
    """One softmax of a method: which keys each query covers and where RoPE puts them.

    A query at position p covers the keys of its document at distances p - n in
    [nearest, farthest] = `distances(p)` (inclusive; farthest may be UNBOUNDED).
    """

    name: str
    distances: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    """Query positions -> (nearest, farthest) distances covered."""
    query_positions: PositionMap
    """Query positions -> the RoPE index queries are rotated at in this pass."""
    key_positions: PositionMap | None = None
    """Key positions -> their RoPE index; None = their own position (cache-friendly)."""
    band: tuple[int, int | None] | None = None
    """(nearest, farthest or None) when the same for every query: the flash path needs it."""


def band_pass(
    name: str, nearest: int, farthest: int | None, query_positions: PositionMap, key_positions: PositionMap | None = None
) -> AttentionPass:
    """A pass covering the same distances [nearest, farthest] for every query."""

    def distances(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        far = UNBOUNDED if farthest is None else farthest
        return torch.full_like(positions, nearest), torch.full_like(positions, far)

    return AttentionPass(name, distances, query_positions, key_positions, (nearest, farthest))


# --- planning ---------------------------------------------------------------------------


@dataclass
class PassPlan:
    """One pass of one forward: rotations, per-query key ranges and per-block work."""

    band: tuple[int, int | None] | None
    """The pass's fixed distance band, if it has one (AttentionPass.band)."""
    query_cos: torch.Tensor
    """[B, Tq, D] cos of the queries' rotation in this pass."""
    query_sin: torch.Tensor
    """[B, Tq, D] sin of the same."""
    key_rotation: int
    """Index into PositionPlan.key_rotations."""
    lower: torch.Tensor
    """[B, Tq] first key index covered (inclusive)."""
    upper: torch.Tensor
    """[B, Tq] last key index covered (inclusive); < lower where the pass covers nothing."""
    blocks: list[list[KeySpans | None]]
    """Per row, per query block: the keys the block attends in this pass, or None if none."""
    flash_keys: _FlashKeys | None = None
    """The flash path's key layout for this pass."""


@dataclass
class PositionPlan:
    """What `PositionMethod.forward` needs about positions; built once per forward."""

    backend: str
    """The resolved `attention()` backend for single-pass methods; 'torch' or 'flash' for the others."""
    q_len: int
    document_ids: torch.Tensor
    """[B, Tk] document id of every key."""
    keys_rotated: bool
    block_size: int
    passes: list[PassPlan]
    key_rotations: list[tuple[torch.Tensor, torch.Tensor] | None]
    """cos/sin [B, Tk, D] for each distinct key position map; None = keys arrive rotated."""
    query_scale: torch.Tensor | None
    """[B, Tq] query multiplier (ReRoPE's log-n), or None."""
    mask: AttentionMask | None = None
    """Single-pass methods: the mask for `attention()`."""
    flash_queries: _FlashQueries | None = None
    """The flash path's query layout (documents laid end to end)."""
    documents: list[_Document] = field(default_factory=list)
    """The torch path's documents with queries, for passes with a fixed band."""


def cos_sin(rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., D] at `positions` [...]; float64 angles for float64 inputs, else float32 (as rope.py)."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    angles = positions.to(compute)[..., None] * rotary.inv_freq.to(positions.device, compute)
    angles = torch.cat([angles, angles], dim=-1)
    factor = rotary.attention_factor
    return (angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)


def _document_starts(position_ids: torch.Tensor, document_ids: torch.Tensor) -> torch.Tensor:
    """[B, Tk] key index where each key's document starts; checks that positions step by
    one inside documents (then a key's distance is its index distance)."""
    same_document = document_ids[:, 1:] == document_ids[:, :-1]
    bad = (position_ids[:, 1:] - position_ids[:, :-1] != 1) & same_document
    if bad.any():
        row, index = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            "position methods need position_ids that increase by 1 inside each document; "
            f"row {row} goes {int(position_ids[row, index])} -> {int(position_ids[row, index + 1])} at key index {index + 1}"
        )
    return document_start_index(document_ids)


def make_plan(method, position_ids, document_ids, q_len, keys_rotated, backend, block_size, dtype) -> PositionPlan:
    if position_ids.dim() != 2:
        raise ValueError(f"position_ids must be [batch, keys], got shape {tuple(position_ids.shape)}")
    batch, kv_len = position_ids.shape
    device = position_ids.device
    q_len = kv_len if q_len is None else q_len
    if not 0 < q_len <= kv_len:
        raise ValueError(f"q_len={q_len} must be in [1, keys={kv_len}]")
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    if document_ids is None:
        document_ids = torch.zeros_like(position_ids)
    if document_ids.shape != position_ids.shape:
        raise ValueError(
            f"document_ids {tuple(document_ids.shape)} and position_ids {tuple(position_ids.shape)} differ in shape"
        )
    if keys_rotated and not method.caches_rotated_keys:
        raise ValueError(f"position method {method.name!r} needs un-rotated keys (keys_rotated=False)")
    offset = kv_len - q_len
    query_positions = position_ids[:, offset:]
    query_scale = None if method.query_scale is None else method.query_scale(query_positions).to(dtype)
    key_maps: list[PositionMap | None] = []
    key_rotations = []

    def key_rotation(key_map: PositionMap | None) -> int:
        if key_map not in key_maps:
            key_maps.append(key_map)
            own = key_map is None
            rotated = own and keys_rotated
            at = position_ids if own else key_map(position_ids)
            key_rotations.append(None if rotated else cos_sin(method.rotary, at, dtype))
        return key_maps.index(key_map)

    if len(method.passes) == 1:
        only = method.passes[0]
        cos, sin = cos_sin(method.rotary, only.query_positions(query_positions), dtype)
        index = key_rotation(only.key_positions)
        empty = torch.empty(0, dtype=torch.long, device=device)
        mask = build_mask(document_ids, q_len, backend)
        pass_plan = PassPlan(only.band, cos, sin, index, empty, empty, [])
        return PositionPlan(
            mask.backend, q_len, document_ids, keys_rotated, block_size, [pass_plan], key_rotations, query_scale, mask
        )

    document_start = _document_starts(position_ids, document_ids)[:, offset:]
    resolved = resolve_backend(backend, device)
    flash = resolved == "flash" and all(p.band is not None for p in method.passes)
    query_index = torch.arange(offset, kv_len, device=device).expand(batch, -1)
    rotated_at = torch.stack([p.query_positions(query_positions) for p in method.passes])
    query_cos, query_sin = cos_sin(method.rotary, rotated_at, dtype)
    segments = _flash_segments(document_ids, q_len) if flash else None
    by_documents = not flash and q_len > 1 and any(p.band is not None for p in method.passes)  # `_band_pass`
    passes = []
    for attention_pass, cos, sin in zip(method.passes, query_cos, query_sin):
        nearest, farthest = attention_pass.distances(query_positions)
        upper = query_index - nearest
        lower = torch.maximum(document_start, query_index - farthest)
        by_blocks = not flash and q_len > 1 and attention_pass.band is None
        blocks = _block_spans(lower, upper, block_size, kv_len) if by_blocks else []
        flash_keys = _cut_segments(segments, attention_pass.band[0]) if flash else None
        index = key_rotation(attention_pass.key_positions)
        passes.append(PassPlan(attention_pass.band, cos, sin, index, lower, upper, blocks, flash_keys))
    return PositionPlan(
        "flash" if flash else "torch", q_len, document_ids, keys_rotated, block_size, passes, key_rotations, query_scale,
        flash_queries=segments.queries if flash else None,
        documents=_documents(document_ids, q_len) if by_documents else [],
    )  # fmt: skip


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

    The fused CPU kernel is ~1.5x slower per key on spans that are not a multiple of
    KEY_ALIGNMENT keys, so the bulk is cut to a multiple and the edges are widened
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
        [_spans(*block, kv_len) if block[-1] else None for block in zip(*(column.tolist() for column in row))]
        for row in zip(*columns)
    ]


def _spans(first: int, end: int, common_first: int, common_end: int, has_empty: bool, nonempty: bool, kv_len: int) -> KeySpans:
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


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PositionPlan) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"expected q [B,Tq,H,D], k/v [B,Tk,Hkv,D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] % k.shape[2]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or head_dim, or heads are not a multiple"
        )
    if (q.shape[1], k.shape[:2]) != (plan.q_len, plan.document_ids.shape):
        raise ValueError(
            f"plan was built for q_len={plan.q_len} and keys {tuple(plan.document_ids.shape)}; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )


def attend_passes(queries: list[torch.Tensor], k: torch.Tensor, v: torch.Tensor, plan: PositionPlan, scale: float):
    """Attention output [B, Tq, H, D] of a multi-pass plan from each pass's rotated
    queries [B, Tq, H, D] and the keys (rotated by each pass's key rotation here unless
    the plan says they arrive rotated)."""
    if plan.q_len == 1 and plan.backend != "flash":
        return _decode_passes(queries, k, v, plan, scale)
    keys = [k if rotation is None else apply_rotary(k, *rotation) for rotation in plan.key_rotations]
    if plan.backend == "flash":
        return _flash_passes(queries, keys, v, plan, scale)
    return _torch_passes(queries, keys, v, plan, scale)


# --- pure-torch passes ------------------------------------------------------------------


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
        for start, keys, queries in zip(starts.tolist(), k_lengths.tolist(), q_lengths.tolist())
        if queries > 0
    ]


def _torch_passes(queries: list[torch.Tensor], keys: list[torch.Tensor], v: torch.Tensor, plan: PositionPlan, scale: float):
    """Every pass's output and log-sum-exp over all queries, then one merge across passes."""
    parts = []
    for pass_plan, query in zip(plan.passes, queries):
        key = keys[pass_plan.key_rotation]
        if pass_plan.band is not None:
            parts.append(_band_pass(query, key, v, pass_plan.band, plan.documents, scale))
        else:
            parts.append(_block_pass(query, key, v, pass_plan, plan.block_size, scale))
    return _merge(parts)[0].to(v.dtype)


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

        def query(i: int, j: int) -> torch.Tensor:  # the queries with document index in [i, j)
            return q[doc.row, query_base + i : query_base + j]

        def key_value(i: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
            return k[doc.row, doc.key_start + i : doc.key_start + j], v[doc.row, doc.key_start + i : doc.key_start + j]

        def write(i: int, result: tuple[torch.Tensor, torch.Tensor]) -> None:
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
        start = max(first, reaching_start)
        blocks = (doc.keys - start) // BAND_BLOCK
        end = start + blocks * BAND_BLOCK
        if blocks:
            rows = query(start, end).unflatten(0, (blocks, BAND_BLOCK))
            span = block_mask.shape[1]
            windows = (
                t.unfold(0, span, BAND_BLOCK).permute(0, 3, 1, 2)
                for t in key_value(start - farthest, end - BAND_BLOCK - farthest + span)
            )
            block_out, block_lse = _kernel(rows, *windows, scale, allowed=block_mask)
            write(start, (block_out.flatten(0, 1), block_lse.flatten(0, 1)))
        if end < doc.keys:
            tail_keys = _unsqueeze(key_value(end - farthest, doc.keys - nearest))
            allowed = _window_mask(doc.keys - end, farthest - nearest + 1, q.device)
            write(end, _squeeze(_kernel(query(end, doc.keys)[None], *tail_keys, scale, allowed=allowed)))
    return out, lse


def _window_mask(queries: int, width: int, device: torch.device) -> torch.Tensor:
    """[queries, width - 1 + queries] boolean: query p sees keys [p, p + width - 1], the
    keys of a block of consecutive queries under a band of `width` distances."""
    query_index = torch.arange(queries, device=device)[:, None]
    key_index = torch.arange(width - 1 + queries, device=device)
    return (key_index >= query_index) & (key_index <= query_index + width - 1)


def _unsqueeze(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(t[None] for t in tensors)


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
                parts.append(_empty_rows(_squeeze(_kernel(query, key[None, start:end], value[None, start:end], scale)), empty))
            if spans.masked:
                key_index = torch.cat([torch.arange(start, end, device=v.device) for start, end in spans.masked])
                allowed = (key_index >= lower[:, None]) & (key_index <= upper[:, None])
                empty = _covered_count(lower, upper, spans.masked) == 0
                masked_k, masked_v = _gather_ranges(key, spans.masked), _gather_ranges(value, spans.masked)
                parts.append(_empty_rows(_squeeze(_kernel(query, masked_k[None], masked_v[None], scale, allowed=allowed)), empty))
            out[b, rows], lse[b, rows] = _merge(parts)
    return out, lse


def _decode_passes(queries: list[torch.Tensor], k: torch.Tensor, v: torch.Tensor, plan: PositionPlan, scale: float):
    """One query per row: each pass covers one contiguous key range, so a row takes one
    kernel call per pass over exactly that range, merged as everywhere else. Keys are
    rotated only in the ranges a pass reads (ReRoPE's window, say, rather than the whole
    cache). Scoring by hand (matmul, softmax, matmul per pass) ran as fast (StRing at
    T=1024: 0.37 vs 0.38 ms per step); the kernel keeps one code path with prefill."""
    batch, _, heads, dim = queries[0].shape
    ranges = [list(zip(p.lower[:, 0].tolist(), p.upper[:, 0].tolist())) for p in plan.passes]
    out = torch.empty(batch, 1, heads, dim, dtype=v.dtype, device=v.device)
    for b in range(batch):
        parts = []
        for pass_plan, query, pass_ranges in zip(plan.passes, queries, ranges):
            start, last = pass_ranges[b]
            if last < start:
                continue
            keys = k[b : b + 1, start : last + 1]
            rotation = plan.key_rotations[pass_plan.key_rotation]
            if rotation is not None:
                keys = apply_rotary(keys, *(t[b : b + 1, start : last + 1] for t in rotation))
            parts.append(_kernel(query[b : b + 1], keys, v[b : b + 1, start : last + 1], scale))
        out[b] = _merge(parts)[0][0].to(v.dtype)
    return out


def _covered_count(lower: torch.Tensor, upper: torch.Tensor, ranges: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """For each query, how many keys of the index ranges [start, end) lie in [lower, upper]."""
    count = torch.zeros_like(lower)
    for start, end in ranges:
        count += (torch.minimum(upper, torch.full_like(upper, end - 1)) - torch.clamp(lower, min=start) + 1).clamp(min=0)
    return count


def _gather_ranges(x: torch.Tensor, ranges: tuple[tuple[int, int], ...]) -> torch.Tensor:
    if len(ranges) == 1:
        return x[ranges[0][0] : ranges[0][1]]
    return torch.cat([x[start:end] for start, end in ranges])

def _kernel(q, k, v, scale: float, *, causal: bool = False, allowed: torch.Tensor | None = None):
    """Softmax attention of q [N, Tq, H, D] over k/v [N, Tk, Hkv, D] (query head h reads
    key head h // (H / Hkv)); causal: query t sees keys <= t (top-left aligned); allowed:
    a [Tq, Tk] boolean mask. Every query must see some key. Returns the output [N, Tq, H, D]
    and log-sum-exp [N, Tq, H] in fp32 (fp64 for fp64 inputs). On CPU this is torch's fused
    flash kernel, which skips the masked half of a causal square; elsewhere fp32 math."""
    q4, k4, v4 = (t.transpose(1, 2) for t in (q, k, v))
    bias = None
    if allowed is not None:
        bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, -math.inf)
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q4, k4, v4, 0.0, causal, attn_mask=bias, scale=scale
        )
    else:
        out, lse = _attend_math(q4, k4, v4, bias, causal, scale)
    merge_dtype = torch.promote_types(q.dtype, torch.float32)
    return out.transpose(1, 2).to(merge_dtype), lse.transpose(1, 2).to(merge_dtype)


def _empty_rows(result: tuple[torch.Tensor, torch.Tensor], empty: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Output 0 and log-sum-exp -inf for the queries flagged in `empty` [Tq] (they saw
    only masked keys, which the kernel does not report)."""
    out, lse = result
    if empty is None or not bool(empty.any()):
        return out, lse
    return out.masked_fill(empty[:, None, None], 0.0), lse.masked_fill(empty[:, None], -math.inf)


def _attend_math(q, k, v, bias, causal: bool, scale: float):
    """The reference for devices without the CPU kernel: q [N, H, Tq, D], k/v [N, Hkv, Tk, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * scale
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores[0, 0], dtype=torch.bool).triu(1), -math.inf)
    if bias is not None:
        scores = scores + bias.float()
    lse = scores.logsumexp(-1)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("bhqk,bhkd->bhqd", weights, v.float()), lse


def _merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the union of several key sets from each one's output [..., D] and
    log-sum-exp [...], in fp32: for two, out_b + sigmoid(lse_a - lse_b) (out_a - out_b)
    (STRING Algorithm 2); for more, sum_i exp(lse_i - logsumexp_j lse_j) out_i. A part with
    lse -inf weighs 0. Returns the merged output and log-sum-exp."""
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        (out_a, lse_a), (out_b, lse_b) = parts
        weight_a = torch.sigmoid(lse_a - lse_b).nan_to_num_(0.0)  # nan: neither part covers the query
        return torch.addcmul(out_b, weight_a[..., None], out_a - out_b), torch.logaddexp(lse_a, lse_b)
    outs = torch.stack([out for out, _ in parts])
    lses = torch.stack([lse for _, lse in parts])
    total = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - total).nan_to_num_(0.0)
    return (outs * weights[..., None]).sum(0), total



# --- flash-attn passes (CUDA) -----------------------------------------------------------


def _flash_passes(queries: list[torch.Tensor], keys: list[torch.Tensor], v: torch.Tensor, plan: PositionPlan, scale: float):
    from flash_attn import flash_attn_varlen_func

    batch, q_len, heads, dim = queries[0].shape
    kv_heads = v.shape[2]
    flat_v = v.reshape(-1, kv_heads, dim)
    merge_dtype = torch.promote_types(v.dtype, torch.float32)
    parts = []
    for pass_plan, q_rot in zip(plan.passes, queries):
        nearest, farthest = pass_plan.band
        layout = pass_plan.flash_keys
        empty = (pass_plan.upper < pass_plan.lower).reshape(-1, 1)
        if layout.max_seqlen_k == 0:  # every document is shorter than `nearest`: nothing to attend
            continue
        flat_k = keys[pass_plan.key_rotation].reshape(-1, kv_heads, dim)
        out, lse, _ = flash_attn_varlen_func(
            q_rot.reshape(-1, heads, dim),
            flat_k[layout.key_index],
            flat_v[layout.key_index],
            cu_seqlens_q=plan.flash_queries.cu_seqlens,
            cu_seqlens_k=layout.cu_seqlens_k,
            max_seqlen_q=plan.flash_queries.max_seqlen,
            max_seqlen_k=layout.max_seqlen_k,
            softmax_scale=scale,
            causal=True,  # bottom-right aligned: query m reaches key m - nearest
            window_size=(-1 if farthest is None else farthest - nearest, 0),
            return_attn_probs=True,
        )
        if lse.shape != (heads, out.shape[0]):
            raise RuntimeError(
                f"flash-attn returned log-sum-exp of shape {tuple(lse.shape)}; position methods need flash-attn >= 2.5"
            )
        out = out.to(merge_dtype).masked_fill(empty[..., None], 0.0)
        parts.append((out, lse.transpose(0, 1).to(merge_dtype).masked_fill(empty, -math.inf)))
    return _merge(parts)[0].view(batch, q_len, heads, dim).to(v.dtype)


@dataclass
class _FlashQueries:
    """Queries of all rows, document by document, as flash-attn's varlen layout."""

    cu_seqlens: torch.Tensor
    max_seqlen: int


@dataclass
class _FlashKeys:
    """One pass's keys: each document's keys but its last `nearest` ones, laid end to end."""

    cu_seqlens_k: torch.Tensor
    key_index: torch.Tensor
    """Flat index (row * Tk + key) of every kept key."""
    max_seqlen_k: int


@dataclass
class _Segments:
    """Documents of all rows laid end to end: flat index of each one's first key, key counts, queries."""

    starts: torch.Tensor
    k_lengths: torch.Tensor
    queries: _FlashQueries


def _flash_segments(document_ids: torch.Tensor, q_len: int) -> _Segments:
    starts, k_lengths, q_lengths = document_segments(document_ids, q_len)
    cu_q = torch.nn.functional.pad(q_lengths.cumsum(0), (1, 0)).to(torch.int32)
    return _Segments(starts, k_lengths, _FlashQueries(cu_q, int(q_lengths.max())))


def _cut_segments(segments: _Segments, nearest: int) -> _FlashKeys:
    """Each document's keys with its last `nearest` dropped: flash's bottom-right causal
    alignment then ends query m of the document at key m - nearest."""
    kept = (segments.k_lengths - nearest).clamp(min=0)
    total = int(kept.sum())
    first = torch.repeat_interleave(segments.starts, kept, output_size=total)
    before = torch.repeat_interleave(kept.cumsum(0) - kept, kept, output_size=total)
    key_index = first + torch.arange(total, device=kept.device) - before
    cu_k = torch.nn.functional.pad(kept.cumsum(0), (1, 0)).to(torch.int32)
    return _FlashKeys(cu_k, key_index, int(kept.max()))
