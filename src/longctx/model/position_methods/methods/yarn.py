"""YaRN: per-dimension interpolation and attention factor (Peng et al., 2023)."""

from __future__ import annotations

from longctx.model.position_methods.method import PositionMethod
from longctx.model.position_methods.methods.rope import rope_method
from longctx.model.position_methods.registry import register_builder
from longctx.model.rope import RopeScaling, RotaryEmbedding


def yarn_method(
    head_dim: int,
    base: float,
    factor: float,
    original_max_position: int,
    training_length: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    position_scale: float = 1.0,
    *,
    rotary_fraction: float = 1.0,
    partial_rotary: str = "first",
) -> PositionMethod:
    """YaRN: rope.py's `yarn` frequencies and cos/sin attention factor (under `first`
    partial rotation: the ramp over the R rotated channels, the factor on them only, as
    transformers' Phi-3)."""
    partial: dict = {"rotary_fraction": rotary_fraction, "partial_rotary": partial_rotary}
    rotary = RotaryEmbedding(head_dim, base, RopeScaling(), training_length, position_scale, **partial)
    return build(rotary, factor, original_max_position, beta_fast, beta_slow)


@register_builder("yarn")
def build(
    rotary: RotaryEmbedding, factor: float, original_max_position: int, beta_fast: float, beta_slow: float
) -> PositionMethod:
    """The model's head dim, base, training length and position scale; YaRN's scaling in
    place of the model's own; its partial rotation kept."""
    params: dict = {
        "factor": factor,
        "original_max_position": original_max_position,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
    }
    return rope_method(rotary.rescaled(RopeScaling("yarn", **params)), "yarn", params)
