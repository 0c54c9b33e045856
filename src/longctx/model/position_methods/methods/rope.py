"""Plain RoPE: one pass over every distance (also the body of ntk and yarn)."""

from __future__ import annotations

from longctx.config.methods.string import REPO_STRING_ATTENTION_FACTOR
from longctx.model.position_methods.method import PositionMethod, own_positions
from longctx.model.position_methods.plan import band_pass
from longctx.model.position_methods.registry import register_builder
from longctx.model.rope import RotaryEmbedding


def rope_method(
    rotary: RotaryEmbedding, name: str = "rope", params: dict | None = None, repo_score_scale: bool = False
) -> PositionMethod:
    """Plain RoPE with `rotary` (also the body of ntk and yarn); `repo_score_scale`: scores
    times StRing's released temperature (1 + 0.1 ln 2)^2, the shift-free ablation arm."""
    multiplier = REPO_STRING_ATTENTION_FACTOR**2 if repo_score_scale else 1.0
    if repo_score_scale:
        params = {**(params or {}), "repo_score_scale": True}
    return PositionMethod(
        name, rotary, [band_pass("causal", 0, None, own_positions)], params=params, score_multiplier=multiplier
    )


@register_builder("rope")
def build(rotary: RotaryEmbedding, repo_score_scale: bool = False) -> PositionMethod:
    return rope_method(rotary, repo_score_scale=repo_score_scale)
