"""Passes and plans: what a position method computes, independent of the kernel.

A position method is a list of *passes*. A pass covers, for every query, a contiguous
range of key distances m - n inside the query's document and rotates queries and keys at
its own RoPE indices. A query's output is the softmax over the union of its passes,
merged from each pass's output and log-sum-exp (STRING Algorithm 2):

    lse = logaddexp(lse_a, lse_b),   out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b

A pass that covers no key of a query has lse = -inf and weight 0. The pure-torch kernels
merge in fp32 (`merge`); the varlen kernel's passes fold into q's dtype with fp32
log-sum-exps (gpu.py).

A `PositionPlan` is built once per forward and read by every layer: the rotations and
per-query key ranges shared by all kernels, plus one kernel-specific layout
(the `AttentionMask` of a one-pass method, cpu.`TorchLayout` or gpu.`VarlenLayout`).

Position ids must increase by one inside a document (evaluation positions always do), so
a key's distance is its index distance; `document_starts` checks this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from longctx.batch import document_start_index
from longctx.model.attention import AttentionMask, check_shapes
from longctx.model.rope import RotaryEmbedding, rotate_half, rotation_dtype

UNBOUNDED = 1 << 40
"""Largest key distance of a pass without a far end."""

PositionMap = Callable[[torch.Tensor], torch.Tensor]
"""Positions [...] -> the RoPE indices they rotate at: [...] (one index for every channel),
or [F, ...] with one index per rotated frequency pair (F = len(rotary.inv_freq); DPE's
per-group scaling). A leading F axis keeps `f(p) - p` (hf_attention's relative maps) exact."""


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
    """(nearest, farthest or None) when the same for every query (varlen kernel: a band)."""
    chunk: tuple[int, int] | None = None
    """(chunk size s, relation) when the pass covers whole position chunks [k s, (k+1) s)
    relative to the query's chunk c: relation 0 = chunk c up to the query, 1 = chunk
    c - 1, 2 = chunks 0 .. c - 2 (DCA; varlen kernel: one segment per query chunk)."""


def band_pass(
    name: str,
    nearest: int,
    farthest: int | None,
    query_positions: PositionMap,
    key_positions: PositionMap | None = None,
) -> AttentionPass:
    """A pass covering the same distances [nearest, farthest] for every query."""

    def distances(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        far = UNBOUNDED if farthest is None else farthest
        return torch.full_like(positions, nearest), torch.full_like(positions, far)

    return AttentionPass(name, distances, query_positions, key_positions, (nearest, farthest))


@dataclass
class PassPlan:
    """One pass of one forward: rotations and per-query key ranges."""

    band: tuple[int, int | None] | None
    """The pass's fixed distance band, if it has one (AttentionPass.band)."""
    chunk: tuple[int, int] | None
    """The pass's chunk relation, if it has one (AttentionPass.chunk)."""
    query_cos: torch.Tensor
    """[B, Tq, D] cos of the queries' rotation in this pass (rotation dtype), times the
    method's query scale (ReRoPE's log-n) where it has one."""
    query_sin: torch.Tensor
    """[B, Tq, D] sin of the same, times the same scale."""
    key_rotation: int
    """Index into PositionPlan.key_rotations."""
    lower: torch.Tensor
    """[B, Tq] first key index covered (inclusive)."""
    upper: torch.Tensor
    """[B, Tq] last key index covered (inclusive); < lower where the pass covers nothing."""
    blocks: list[list[Any]]
    """Torch kernels, passes without a band: per row, per query block, the block's
    cpu.KeySpans (or None if it covers nothing). Empty elsewhere."""


@dataclass
class PositionPlan:
    """What `PositionMethod.forward` needs about positions; built once per forward."""

    q_len: int
    document_ids: torch.Tensor
    """[B, Tk] document id of every key."""
    keys_rotated: bool
    passes: list[PassPlan]
    key_rotations: list[tuple[torch.Tensor, torch.Tensor] | None]
    """cos/sin [B, Tk, D] for each distinct key position map; None = keys arrive rotated."""
    layout: Any
    """The kernel's view of the batch: the `attention()` mask of a one-pass method (rope,
    ntk, yarn), cpu.TorchLayout or gpu.VarlenLayout."""

    @property
    def backend(self) -> str:
        """The `attention()` backend of a single-pass plan; 'torch' or 'flash' for the others."""
        return self.layout.backend

    @property
    def mask(self) -> AttentionMask | None:
        return self.layout if isinstance(self.layout, AttentionMask) else None


def cos_sin(
    rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype, *, per_frequency: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., D] at `positions` [...] in `rotation_dtype(dtype)`: fp64 for fp64
    inputs, else fp32 (rope.py's dtype rule; `apply_rotary` casts the result back).
    per_frequency: `positions` is [F, ...], pair i rotating at positions[i] (PositionMap)."""
    compute = rotation_dtype(dtype)
    inv_freq = rotary.inv_freq.to(positions.device, compute)
    if per_frequency:
        if positions.shape[0] != inv_freq.shape[0]:
            raise ValueError(f"per-frequency positions hold {positions.shape[0]} rows for {inv_freq.shape[0]} pairs")
        angles = positions.to(compute).movedim(0, -1) * inv_freq
    else:
        angles = positions.to(compute)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    factor = rotary.attention_factor
    return angles.cos() * factor, angles.sin() * factor


def mapped_cos_sin(
    rotary: RotaryEmbedding, positions: torch.Tensor, position_map: PositionMap, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., D] of `positions` [...] moved by `position_map`, whichever of its two
    output shapes (PositionMap) it returns."""
    mapped = position_map(positions)
    return cos_sin(rotary, mapped, dtype, per_frequency=mapped.dim() == positions.dim() + 1)


def rotated_queries(q: torch.Tensor, passes: list[PassPlan]) -> list[torch.Tensor]:
    """Each pass's queries: q cos + rotate_half(q) sin [B, Tq, H, D], computed in cos/sin's
    (rotation) dtype and rounded once to q's. q enters the products in its own dtype, widened
    inside the ops (exact), and without autograd (`out=` has none) the sum is written straight
    into a tensor of q's dtype (CUDA casts as it stores; CPU through a temporary): no wide
    copy of q, none of the result. cos/sin of R < D channels (`first` partial rotation,
    rope.py) rotate q's first R channels; the others pass through, as in `apply_rotary`."""
    rotary_dim = passes[0].query_cos.shape[-1] if passes else q.shape[-1]
    if rotary_dim < q.shape[-1]:
        rest = q[..., rotary_dim:]
        return [torch.cat([part, rest], dim=-1) for part in rotated_queries(q[..., :rotary_dim], passes)]
    swapped = rotate_half(q)  # shared by every pass
    recording = torch.is_grad_enabled() and q.requires_grad
    return [
        torch.addcmul(q * p.query_cos[:, :, None], swapped, p.query_sin[:, :, None]).to(q.dtype)
        if recording
        else torch.addcmul(q * p.query_cos[:, :, None], swapped, p.query_sin[:, :, None], out=torch.empty_like(q))
        for p in passes
    ]


def document_starts(position_ids: torch.Tensor, document_ids: torch.Tensor) -> torch.Tensor:
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


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PositionPlan) -> None:
    """`attention()`'s shape checks, then that q and k are the plan's."""
    check_shapes(q, k, v)
    if (q.shape[1], k.shape[:2]) != (plan.q_len, plan.document_ids.shape):
        raise ValueError(
            f"plan was built for q_len={plan.q_len} and keys {tuple(plan.document_ids.shape)}; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )


def merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the union of several key sets from each one's output [..., D] and
    log-sum-exp [...], in fp32: for two, out_b + sigmoid(lse_a - lse_b) (out_a - out_b)
    (STRING Algorithm 2); for more, sum_i exp(lse_i - logsumexp_j lse_j) out_i. A part with
    lse -inf weighs 0. Returns the merged output and log-sum-exp."""
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        (out_a, lse_a), (out_b, lse_b) = parts
        weight_a = torch.sigmoid(lse_a - lse_b).nan_to_num(0.0)  # nan: neither part covers the query
        return torch.addcmul(out_b, weight_a[..., None], out_a - out_b), torch.logaddexp(lse_a, lse_b)
    outs = torch.stack([out for out, _ in parts])
    lses = torch.stack([lse for _, lse in parts])
    total = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - total).nan_to_num(0.0)
    return (outs * weights[..., None]).sum(0), total
