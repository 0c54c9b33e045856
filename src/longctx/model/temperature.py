"""Attention temperature (docs/design.md §5): each query times a factor of its position,
after RoPE (as transformers' Llama 4 applies it; the factor is one scalar per query, so it
commutes with the rotation and stacks on every position method).

- `llama4` (transformers' Llama 4 `attn_temperature_tuning`):
  t(p) = log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1, 1 below floor_scale - 1;
- `ssmax` (Scalable-Softmax, Nakanishi 2025): t = s log n, n the number of keys the query
  sees: p + 1 in a full layer, min(p + 1, W) in a sliding one (the paper's n is the softmax's
  input size; in a causal document that is the position + 1). s = `ssmax_s`, or
  1 / ln(max_position) when 0 (t = 1 at the trained length).

p is the query's position id (the batch contract's, reset per document; rewritten ids under
PoSE/SkipAlign count as they are). transformers counts Llama 4's positions from the cache
length, the same ids for an unpacked row.
"""

from __future__ import annotations

import math

import torch

from longctx.config.temperature import AttentionTemperature


def temperature_factor(
    temperature: AttentionTemperature, position_ids: torch.Tensor, *, window: int, max_position: int, dtype: torch.dtype
) -> torch.Tensor:
    """The factor [B, T, 1, 1] (fp32, fp64 for fp64 activations) for queries at position_ids [B, T]."""
    compute = torch.promote_types(dtype, torch.float32)
    positions = position_ids.to(compute)
    if temperature.type == "llama4":
        factor = torch.log1p(torch.floor((positions + 1.0) / temperature.floor_scale)) * temperature.attn_scale + 1.0
    elif temperature.type == "ssmax":
        keys = positions + 1.0
        if window:
            keys = keys.clamp(max=window)
        s = temperature.ssmax_s or 1.0 / math.log(max_position)
        factor = s * torch.log(keys)
    else:
        raise ValueError(f"model.attn_temperature.type={temperature.type!r} scales no query")
    return factor[..., None, None]


def tempered(q: torch.Tensor, factor: torch.Tensor | None) -> torch.Tensor:
    """Rotated queries q [B, T, H, D] times the factor [B, T, 1, 1], in q's dtype; q itself
    without one."""
    return q if factor is None else (q * factor).to(q.dtype)
