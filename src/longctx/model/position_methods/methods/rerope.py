"""ReRoPE: P' = min(P, window), log-n query scaling (Su, 2023)."""

from __future__ import annotations

import math

import torch

from longctx.model.position_methods.method import PositionMethod, own_positions
from longctx.model.position_methods.plan import band_pass
from longctx.model.position_methods.registry import register_builder
from longctx.model.rope import RotaryEmbedding


@register_builder("rerope")
def rerope_method(rotary: RotaryEmbedding, window: int, log_scale_length: int = -1) -> PositionMethod:
    """ReRoPE: P' = min(P, window); log-n query scaling against log_scale_length (-1 = off)."""
    if window <= 0:
        raise ValueError(f"ReRoPE window must be > 0, got {window}")
    if log_scale_length > 0 and rotary.rotary_dim < rotary.head_dim:
        raise ValueError(
            "rerope: log-n query scaling would scale only the rotated channels under model.partial_rotary=first "
            f"(rotary_fraction {rotary.rotary_fraction}); set log_scale_length=-1 or use partial_rotary=p-rope"
        )
    passes = [
        band_pass("window", 0, window - 1, own_positions),
        band_pass("rectified", window, None, lambda p: torch.full_like(p, window), torch.zeros_like),
    ]
    query_scale = None
    if log_scale_length > 0:
        log_length = math.log(log_scale_length)

        def query_scale(positions: torch.Tensor) -> torch.Tensor:
            return (torch.log1p(positions.double()) / log_length).clamp(min=1)

    params = {"window": window, "log_scale_length": log_scale_length}
    return PositionMethod("rerope", rotary, passes, params=params, query_scale=query_scale)
