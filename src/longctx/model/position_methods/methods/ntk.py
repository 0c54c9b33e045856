"""NTK-aware scaling: RoPE with base * factor^(d/(d-2)) (LocalLLaMA, 2023)."""

from __future__ import annotations

from longctx.model.position_methods.method import PositionMethod
from longctx.model.position_methods.methods.rope import rope_method
from longctx.model.position_methods.registry import register_builder
from longctx.model.rope import RopeScaling, RotaryEmbedding


def ntk_method(
    head_dim: int,
    base: float,
    factor: float,
    training_length: int,
    position_scale: float = 1.0,
    *,
    rotary_fraction: float = 1.0,
    partial_rotary: str = "first",
) -> PositionMethod:
    """NTK-aware scaling: RoPE with base * factor^(d/(d-2)) (rope.py's `ntk`; d: the
    channels the frequencies are computed over, R under `first` partial rotation)."""
    partial: dict = {"rotary_fraction": rotary_fraction, "partial_rotary": partial_rotary}
    rotary = RotaryEmbedding(head_dim, base, RopeScaling(), training_length, position_scale, **partial)
    return build(rotary, factor)


@register_builder("ntk")
def build(rotary: RotaryEmbedding, factor: float) -> PositionMethod:
    """The model's head dim, base, training length and position scale; NTK's scaling in
    place of the model's own; its partial rotation kept."""
    return rope_method(rotary.rescaled(RopeScaling("ntk", factor=factor)), "ntk", {"factor": factor})
