"""StRing (STRING §4.1 Eq. 4): a diagonal pass and a shifted pass (see method.py)."""

from __future__ import annotations

from longctx.config.methods.string import REPO_STRING_ATTENTION_FACTOR, STRING_COMPAT
from longctx.model.position_methods.method import PositionMethod, own_positions
from longctx.model.position_methods.plan import band_pass
from longctx.model.position_methods.registry import register_builder
from longctx.model.rope import RotaryEmbedding


@register_builder("string")
def string_method(
    rotary: RotaryEmbedding, shift: int, local_window: int = 128, compat: str = "paper"
) -> PositionMethod:
    """StRing (STRING Eq. 4) with shift S and local window W; see the module docstring."""
    if shift <= 0:
        raise ValueError(f"StRing shift S must be > 0, got {shift}")
    if not 0 <= local_window < shift:
        raise ValueError(f"StRing local_window W must be in [0, shift S={shift}), got {local_window}")
    if compat not in STRING_COMPAT:
        raise ValueError(f"StRing compat={compat!r} is not one of {STRING_COMPAT}")
    shifted = band_pass("shifted", shift, None, lambda p: p - shift + local_window)
    paper = [band_pass("diagonal", 0, shift - 1, own_positions), shifted]
    params = {"shift": shift, "local_window": local_window, "compat": compat}
    if compat == "paper":
        return PositionMethod("string", rotary, paper, params=params)
    repo_prefill = [band_pass("diagonal", 0, shift, own_positions), shifted]
    multiplier = REPO_STRING_ATTENTION_FACTOR**2
    return PositionMethod(
        "string", rotary, repo_prefill, params=params, score_multiplier=multiplier, decode_passes=paper
    )
