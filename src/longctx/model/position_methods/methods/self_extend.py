"""Self-Extend: exact neighbours, grouped positions beyond (Jin et al., 2024)."""

from __future__ import annotations

import torch

from longctx.model.position_methods.method import PositionMethod, own_positions
from longctx.model.position_methods.plan import band_pass
from longctx.model.position_methods.registry import register_builder
from longctx.model.rope import RotaryEmbedding


@register_builder("self_extend")
def self_extend_method(rotary: RotaryEmbedding, neighbor_window: int, group_size: int) -> PositionMethod:
    """Self-Extend: exact below neighbor_window, grouped (floor-divided by group_size) beyond."""
    if neighbor_window <= 0 or group_size <= 0:
        raise ValueError(
            f"Self-Extend needs neighbor_window > 0 and group_size > 0, got {neighbor_window}, {group_size}"
        )
    offset = neighbor_window - neighbor_window // group_size
    passes = [
        band_pass("neighbor", 0, neighbor_window - 1, own_positions),
        band_pass(
            "grouped",
            neighbor_window,
            None,
            lambda p: torch.div(p, group_size, rounding_mode="floor") + offset,
            lambda p: torch.div(p, group_size, rounding_mode="floor"),
        ),
    ]
    params = {"neighbor_window": neighbor_window, "group_size": group_size}
    return PositionMethod("self_extend", rotary, passes, params=params)
