"""Attention sinks (gpt-oss; docs/design.md §5): one learned logit s_h per query head joins
every softmax's denominator and contributes no value,

    out_i = sum_j exp(x_ij) v_j / (sum_j exp(x_ij) + exp(s_h)) = out_attn_i * sigmoid(lse_i - s_h)

with x the scaled scores, out_attn the ordinary attention output and lse_i = log sum_j
exp(x_ij). Every backend but the dense reference uses the right-hand side with the
log-sum-exp its kernel returns, so no score matrix is built:

- `sdpa` (the reference): explicit scores with the sink as one more column (`dense_with_sinks`);
- `varlen`: each kernel call through `sdpa_with_sinks` (CPU: torch's fused flash kernel,
  which returns the lse; elsewhere explicit math);
- `flash`: the varlen kernel's lse (`flash_with_sinks`);
- `flex`: flex_attention's lse (`return_aux`);
- a multi-pass position method (StRing, ReRoPE, Self-Extend, DCA): the lse of its passes'
  merged softmax, so the sink counts once in the union of the passes' keys
  (PositionMethod.forward).

Gradients: the fused CPU kernel and torch's varlen kernel drop the gradient of the lse
(their backward ignores grad_lse), which the sink factor needs. `lse_with_gradient` adds it
back exactly with one more call of the same kernel (position_methods/gpu.py's merge of
passes needs it too): d lse_i / d q_i = s sum_j P_ij k_j and
d lse_i / d k_j = s P_ij q_i, read off a call that attends with the keys as values. The
sinks' own gradient flows through sigmoid(lse - s_h).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(q, k, values) -> output, the kernel call whose lse is being differentiated, with its mask."""


def recording(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def lse_with_gradient(
    lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor, attend: Attend, scale: float
) -> torch.Tensor:
    """`lse` (detached: its kernel's backward ignores it) plus a term of value exactly 0 whose
    gradient is d lse / d (q, k). With A_i = sum_j P_ij k_j (`attend` with the keys as
    values, q and k detached in the score slots): f_i = s (q_i . sg(A_i) + sg(q_i) . A_i), so
    df_i / dq_i = s A_i and df_i / dk_j = s P_ij q_i; f - sg(f) is 0. `lse` has q's shape
    without its last dimension."""
    mean_key = attend(q.detach(), k.detach(), k).to(lse.dtype)
    wide_q = q.to(lse.dtype)
    term = scale * ((wide_q * mean_key.detach()).sum(-1) + (wide_q.detach() * mean_key).sum(-1))
    return lse.detach() + (term - term.detach())


def apply_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, head_dim: int) -> torch.Tensor:
    """out * sigmoid(lse - s_h): out [..., D] with its heads at dimension `head_dim`, lse of
    out's shape without D. Computed in fp32 (fp64 for fp64 inputs), returned in out's dtype."""
    compute = torch.promote_types(lse.dtype, torch.float32)
    shape = [1] * lse.dim()
    shape[head_dim] = -1
    factor = torch.sigmoid(lse.to(compute) - sinks.to(compute).view(shape))
    return (out.to(compute) * factor[..., None]).to(out.dtype)


def dense_with_sinks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float, sinks: torch.Tensor
) -> torch.Tensor:
    """The reference: q [B, H, Tq, D], k/v [B, Hkv, Tk, D], allowed a boolean mask that
    broadcasts to [B, H, Tq, Tk]; softmax over the scores and the sink column, the sink's
    probability dropped (transformers' gpt-oss eager attention, without its max shift)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    compute = torch.promote_types(q.dtype, torch.float32)
    scores = torch.einsum("bhqd,bhkd->bhqk", q.to(compute), k.to(compute)) * scale
    scores = scores.masked_fill(~allowed, -math.inf)
    sink = sinks.to(compute).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    return torch.einsum("bhqk,bhkd->bhqd", probs, v.to(compute)).to(v.dtype)


def sdpa_with_sinks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    *,
    scale: float,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """`F.scaled_dot_product_attention` (GQA allowed; q [..., H, Tq, D] with one or no batch
    dimension; attn_mask boolean [Tq, Tk]) with the sinks: out * sigmoid(lse - s_h)."""
    unbatched = q.dim() == 3
    if unbatched:
        q, k, v = q[None], k[None], v[None]
    gqa = q.shape[1] != k.shape[1]

    def attend(query: torch.Tensor, key: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            query, key, values, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=gqa
        )

    bias = None
    if attn_mask is not None:
        bias = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~attn_mask, -math.inf)
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=bias, scale=scale
        )
        if recording(q, k, v):
            lse = lse_with_gradient(lse, q, k, attend, scale)
    else:
        out, lse = attend_math(q, k, v, bias, is_causal, scale)
        out = out.to(v.dtype)
    out = apply_sinks(out, lse, sinks, head_dim=1)
    return out[0] if unbatched else out


def attend_math(q, k, v, bias, causal: bool, scale: float):
    """Output and log-sum-exp by explicit scores, both differentiable: the reference for
    devices without the fused CPU kernel and for autograd (here and in
    position_methods/cpu.py). q [N, H, Tq, D], k/v [N, Hkv, Tk, D]; `bias` additive (0 or
    -inf) [Tq, Tk] or None; computed and returned in fp32 (fp64 for fp64 inputs)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    compute = torch.promote_types(q.dtype, torch.float32)
    scores = torch.einsum("bhqd,bhkd->bhqk", q.to(compute), k.to(compute)) * scale
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores[0, 0], dtype=torch.bool).triu(1), -math.inf)
    if bias is not None:
        scores = scores + bias.to(compute)
    # A query that sees no key outputs 0 with lse -inf; its scores are zeroed first, so that
    # no inf - inf (NaN) reaches autograd.
    empty = torch.isneginf(scores).all(-1, keepdim=True)
    scores = scores.masked_fill(empty, 0.0)
    lse = scores.logsumexp(-1, keepdim=True)
    weights = torch.exp(scores - lse).masked_fill(empty, 0.0)
    out = torch.einsum("bhqk,bhkd->bhqd", weights, v.to(compute))
    return out, lse.squeeze(-1).masked_fill(empty.squeeze(-1), -math.inf)


def flash_with_sinks(q, k, v, seg: Any, window: tuple[int, int], scale: float, sinks: torch.Tensor) -> torch.Tensor:
    """The varlen kernel on packed q [N, H, D], k/v [Nk, Hkv, D] (seg: the batch's
    packed_attention._FlashSegments) with its lse [H, N]; the lse's gradient added back by
    one more call when autograd records."""

    def attend(query: torch.Tensor, key: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return seg.attend(query, key, values, scale=scale, window=window)[0]

    out, lse = seg.attend(q, k, v, scale=scale, window=window, lse=True)
    assert lse is not None
    lse = lse.t()  # [N, H]
    if recording(q, k, v):
        lse = lse_with_gradient(lse, q, k, attend, scale)
    return apply_sinks(out, lse, sinks, head_dim=1)


def flex_with_sinks(q, k, v, block_mask, scale: float, sinks: torch.Tensor, *, compiled: Callable[..., Any]):
    """flex_attention (q [B, H, Tq, D]) with its lse; the lse's gradient added back by one
    more call when autograd records. torch 2.14's compiled flex on CPU returns no lse, so on
    CPU (an inference backend there) flex runs uncompiled, which scores densely."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    flex = compiled if q.device.type != "cpu" else cast(Callable[..., Any], flex_attention)
    gqa = q.shape[1] != k.shape[1]

    def attend(query: torch.Tensor, key: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return flex(query, key, values, block_mask=block_mask, scale=scale, enable_gqa=gqa)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*without torch.compile.*")
        out, aux = flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa, return_aux=AuxRequest(lse=True))
    lse = aux.lse
    if recording(q, k, v):
        lse = lse_with_gradient(lse, q, k, attend, scale)
    return apply_sinks(out, lse, sinks, head_dim=1)
