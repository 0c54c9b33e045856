"""Attention temperature's configuration (docs/design.md §5): each query times a factor of its
position, `model.attn_temperature` and `eval.attn_temperature`. No torch."""

from __future__ import annotations

from dataclasses import dataclass

from longctx.config.checks import choice
from longctx.errors import ConfigError

TEMPERATURE_TYPES = ("none", "llama4", "ssmax")
"""Values of `model.attn_temperature.type`: queries times a per-position factor (after
RoPE; it commutes with the rotation, so it stacks on every position method). `llama4`:
transformers' Llama 4 `attn_temperature_tuning`, log(floor((p + 1) / floor_scale) + 1) *
attn_scale + 1; `ssmax`: Scalable-Softmax's s log n with n the keys the query sees."""

TEMPERATURE_LAYERS = ("auto", "all", "nope")
"""Values of `model.attn_temperature.layers`: which layers scale their queries; `auto` =
the NoPE layers under `llama4` (as transformers applies it), every layer under `ssmax`."""


@dataclass
class AttentionTemperature:
    """Attention temperature (docs/design.md §5): each query times a factor of its position.
    The same fields serve `eval.attn_temperature`, which overrides the checkpoint's at
    evaluation (there `type: model`, the default, keeps the checkpoint's)."""

    type: str = "none"
    """none | llama4 | ssmax (see TEMPERATURE_TYPES)."""
    layers: str = "auto"
    """auto | all | nope: the layers that scale their queries (see TEMPERATURE_LAYERS)."""
    floor_scale: float = 8192.0
    """llama4: positions are counted in units of floor_scale tokens (transformers' `floor_scale`)."""
    attn_scale: float = 0.1
    """llama4: the log's coefficient (transformers' `attn_scale`)."""
    ssmax_s: float = 0.0
    """ssmax: s in s log n; 0 = 1 / ln(model.max_position), a factor of 1 at the trained length."""

    def validate(self, prefix: str = "model.attn_temperature", allow_model: bool = False) -> None:
        types = (*TEMPERATURE_TYPES, "model") if allow_model else TEMPERATURE_TYPES
        choice(f"{prefix}.type", self.type, types)
        choice(f"{prefix}.layers", self.layers, TEMPERATURE_LAYERS)
        for name, minimum in (("floor_scale", 0.0), ("attn_scale", None), ("ssmax_s", None)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
                raise ConfigError(f"{prefix}.{name}", f"must be a number, got {value!r}")
            if minimum is not None and not value > minimum:
                raise ConfigError(f"{prefix}.{name}", f"must be > {minimum:g}, got {value!r}")
        if self.ssmax_s < 0:
            raise ConfigError(f"{prefix}.ssmax_s", f"must be >= 0 (0 = 1 / ln(model.max_position)), got {self.ssmax_s}")

    def applies_to(self, rope: bool) -> bool:
        """Whether a layer (rope: it rotates) scales its queries."""
        if self.type == "none":
            return False
        layers = self.layers if self.layers != "auto" else ("nope" if self.type == "llama4" else "all")
        return layers == "all" or not rope
