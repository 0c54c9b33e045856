"""DPE: Self-Extend per group of RoPE frequency pairs (Lu et al., 2025, §3)."""

from __future__ import annotations

import torch

from longctx.config.methods.dpe import parse_scales
from longctx.model.position_methods.method import PositionMethod, own_positions
from longctx.model.position_methods.plan import band_pass
from longctx.model.position_methods.registry import register_builder
from longctx.model.rope import RotaryEmbedding


def pair_scales(pairs: int, scale_factors: tuple[int, ...]) -> torch.Tensor:
    """[pairs] scale of every rotated frequency pair: the groups split the pairs evenly,
    fastest first (the authors' `dimension_groups_range`, [0, 8, ..., 64] for 64 pairs)."""
    groups = len(scale_factors)
    if groups == 0 or pairs % groups:
        raise ValueError(f"DPE: {groups} scale factors cannot split {pairs} rotated frequency pairs evenly")
    return torch.tensor(scale_factors, dtype=torch.long).repeat_interleave(pairs // groups)


@register_builder("dpe")
def dpe_method(rotary: RotaryEmbedding, local_window: int, scale_factors: str | tuple[int, ...]) -> PositionMethod:
    """DPE with window W and scales s_g. For query m and key n of a document, pair i of group g:

        P'_i = m - n                                          if m - n < W
        P'_i = floor(m / s_g) - floor(n / s_g) + W - W / s_g  otherwise

    (the released `dpe_flash_forward`: a window pass of flash-attn window (W - 1, 0) at own
    positions and a far pass over the keys n <= m - W at the scaled positions, merged by
    their log-sum-exps). A group with s_g = 1 keeps RoPE. Keys rotate at rewritten
    positions, so the KV cache holds them un-rotated, as for Self-Extend."""
    if local_window <= 0:
        raise ValueError(f"DPE needs local_window > 0, got {local_window}")
    factors = parse_scales(scale_factors, "scale_factors")
    scales = pair_scales(rotary.inv_freq.shape[0], factors)
    offsets = local_window - torch.div(local_window, scales, rounding_mode="floor")

    def per_pair(positions: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return values.to(positions.device).view(-1, *([1] * positions.dim()))

    def scaled_queries(positions: torch.Tensor) -> torch.Tensor:
        return torch.div(positions, per_pair(positions, scales), rounding_mode="floor") + per_pair(positions, offsets)

    def scaled_keys(positions: torch.Tensor) -> torch.Tensor:
        return torch.div(positions, per_pair(positions, scales), rounding_mode="floor")

    passes = [
        band_pass("window", 0, local_window - 1, own_positions),
        band_pass("scaled", local_window, None, scaled_queries, scaled_keys),
    ]
    params = {"local_window": local_window, "scale_factors": "-".join(str(factor) for factor in factors)}
    return PositionMethod("dpe", rotary, passes, params=params)
