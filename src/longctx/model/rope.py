"""Rotary position embeddings (RoPE) and their context-extension scalings.

RoPE (Su et al., 2021) rotates each pair of channels (i, i + d/2) of a query or key at
position m by the angle m * theta_i, with theta_i = base^(-2i/d). The dot product of a
rotated query at m and key at n then depends only on m - n, which is the *relative
position* whose training frequency f(i) the STRING paper studies (§2.2).

This module owns the inverse frequencies theta_i for every supported scaling and the
application of the rotation at arbitrary, per-token `position_ids` (packed documents,
SkipAlign/PoSE skips, StRing's shifted query ids all reuse it):

- `none`:    theta_i = base^(-2i/d).
- `linear`:  positional interpolation (Chen et al., 2023): theta_i / factor.
- `ntk`:     NTK-aware scaling: base' = base * factor^(d / (d - 2)), so the lowest
             frequency is interpolated by `factor` while the highest stays unchanged.
- `yarn`:    YaRN (Peng et al., 2023, §3.2-3.4): per-dimension blend of interpolation
             and extrapolation with a linear ramp between the wavelengths that rotate
             beta_fast and beta_slow times over the original context, plus an attention
             temperature folded into cos/sin: sqrt(1/t) = 0.1 ln(factor) + 1.
- `llama3`:  Llama 3.1 frequency-band scaling: wavelengths longer than
             L_orig / low_freq_factor are divided by `factor`, shorter than
             L_orig / high_freq_factor are kept, and the band between is interpolated.
- `longrope`: LongRoPE (Ding et al., 2024) as Phi-3 ships it and transformers applies it:
             theta_i / short_factor[i] in a forward whose largest position + 1 is at most
             L_orig, theta_i / long_factor[i] in one past it (one set for the whole
             forward, chosen on the device without a host sync); cos/sin times
             sqrt(1 + ln(factor) / ln(L_orig)) in both (`attention_factor` if set; 1 for
             factor 1). Keys enter the KV cache rotated, so cached forwards that cross
             L_orig leave the earlier keys with the short rotation and give later ones the
             long, as transformers' Phi-3 forward with a cache does; its `generate`, and
             longctx's (model/inference/generation.py), re-run the sequence whole when it first
             reaches L_orig + 1 tokens.

On top of any scaling, `position_scale` s multiplies every theta_i (model.rope_position_scale):
the angle at distance i becomes i * s * theta_i, so a window of L tokens has the angles of
an L * s window under plain RoPE. The miniature replication (docs/design.md §13) uses it
to make distance harder to ignore: with base 10,000 and head_dim 32 a 512-token window
leaves 8 of 16 pairs short of one full turn; s = 2 leaves 7, s = 4 leaves 5. The fastest pair turns
s * 1 rad per token, so for s > pi it aliases (an offset of 1 reads like 1 - 2 pi / s):
that pair no longer orders neighbours, the slower pairs still do. s = 1 is bitwise plain RoPE.

Channel layout is the Hugging Face one ("rotate half": channel i pairs with i + d/2),
so exported weights need no permutation.

Partial rotation (model.rotary_fraction p < 1, model.partial_rotary), D = head_dim:

- `first`: transformers' `partial_rotary_factor` (Phi-3/4, GPT-NeoX, StableLM): R = int(p D)
  channels rotate, the first R of each head, rotate-half *within* them (channel i pairs
  with i + R/2), with theta_i = base^(-2i/R) computed over R (every scaling too: ntk's
  base' = base a^(R/(R-2)), yarn's ramp over R); channels R..D-1 pass through. cos/sin are
  [.., R] and `apply_rotary` rotates the first cos.shape[-1] channels (as transformers'
  Phi-3 `apply_rotary_pos_emb`), so YaRN's cos/sin factor scales the rotated channels only,
  as in transformers.
- `p-rope`: Barbero et al., ICLR 2025 ("Round and Round We Go"), transformers'
  `proportional` rope type (Gemma 4): theta_i = base^(-2i/D) over the full D, and the
  slowest pairs get theta_i = 0 (cos 1, sin 0: unrotated), keeping the first
  int(p D // 2) = floor(p D / 2) pairs (transformers' count; p = 0.25, D = 64: 8 of 32).
  cos/sin stay [.., D], so every consumer of `inv_freq` (the position methods included)
  carries it unchanged; the zero frequencies stay zero under every scaling.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from longctx.config.model import ROPE_SCALING_TYPES, ModelConfig, RopeScaling

__all__ = [
    "ROPE_SCALING_TYPES",
    "RopeScaling",
    "RotaryEmbedding",
    "apply_rotary",
    "inverse_frequencies",
    "longrope_forced",
    "rotate_half",
    "rotation_dtype",
]


def cos_sin_factor(scaling: RopeScaling, max_position: int) -> float:
    """The multiplier of cos/sin: longrope's attention factor; YaRN's, the square root of
    its attention temperature (§3.4), 0.1 ln(factor) + 1, or the config's `attention_factor`
    (1 for factor <= 1); else 1."""
    if scaling.type == "longrope":
        return longrope_attention_factor(scaling, max_position)
    if scaling.type != "yarn":
        return 1.0
    if scaling.attention_factor > 0:
        return scaling.attention_factor
    return 0.1 * math.log(scaling.factor) + 1.0 if scaling.factor > 1 else 1.0


def longrope_attention_factor(scaling: RopeScaling, max_position: int) -> float:
    """sqrt(1 + ln(factor) / ln(L_orig)) (transformers' `_compute_longrope_parameters`: the
    LongRoPE paper's temperature, keeping attention entropy at the extended length), or the
    config's `attention_factor`; 1 for factor <= 1."""
    if scaling.attention_factor > 0:
        return scaling.attention_factor
    if scaling.factor <= 1:
        return 1.0
    original = scaling.original_max_position or max_position
    return math.sqrt(1 + math.log(scaling.factor) / math.log(original))


def inverse_frequencies(
    head_dim: int,
    base: float,
    scaling: RopeScaling,
    max_position: int,
    position_scale: float = 1.0,
    long: bool = False,
) -> torch.Tensor:
    """theta_i for i in [0, head_dim/2), float32, under the given scaling, times `position_scale`
    (`longrope`: divided by short_factor, or by long_factor with `long`)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    kind = scaling.type
    if kind == "ntk":
        base = base * scaling.factor ** (head_dim / (head_dim - 2))
    inv_freq = 1.0 / base**exponents
    if kind in ("none", "ntk"):
        pass
    elif kind == "linear":
        inv_freq = inv_freq / scaling.factor
    elif kind == "yarn":
        inv_freq = _yarn_inverse_frequencies(inv_freq, head_dim, base, scaling, max_position)
    elif kind == "llama3":
        inv_freq = _llama3_inverse_frequencies(inv_freq, scaling, max_position)
    elif kind == "longrope":
        factors = scaling.long_factor if long else scaling.short_factor
        if len(factors) != len(inv_freq):
            raise ValueError(f"longrope has {len(factors)} factors for {len(inv_freq)} rotated pairs")
        inv_freq = inv_freq / torch.tensor(factors, dtype=torch.float64)
    else:
        raise ValueError(f"rope scaling type {kind!r} is not one of {ROPE_SCALING_TYPES}")
    if position_scale != 1.0:
        inv_freq = inv_freq * position_scale
    return inv_freq.float()


def _yarn_inverse_frequencies(
    inv_freq: torch.Tensor, head_dim: int, base: float, scaling: RopeScaling, max_position: int
) -> torch.Tensor:
    original = scaling.original_max_position or max_position

    def dimension_with_rotations(rotations: float) -> float:
        # Solve original / (2 pi base^(2i/d)) = rotations for i (YaRN Eq. 17).
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dimension_with_rotations(scaling.beta_fast)), 0)
    high: float = min(math.ceil(dimension_with_rotations(scaling.beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    # ramp = 0: fast dimension, keep (extrapolate); ramp = 1: slow dimension, interpolate.
    return inv_freq * (1 - ramp) + (inv_freq / scaling.factor) * ramp


def _llama3_inverse_frequencies(inv_freq: torch.Tensor, scaling: RopeScaling, max_position: int) -> torch.Tensor:
    original = scaling.original_max_position or max_position
    wavelength = 2 * math.pi / inv_freq
    long_wavelength = original / scaling.low_freq_factor
    short_wavelength = original / scaling.high_freq_factor
    smooth = (original / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = torch.where(wavelength > long_wavelength, inv_freq / scaling.factor, inv_freq)
    in_band = (wavelength >= short_wavelength) & (wavelength <= long_wavelength)
    return torch.where(in_band, blended, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Computes cos/sin for arbitrary position ids; `apply_rotary` rotates q and k.
    `rotary_fraction` / `partial_rotary`: partial rotation (module docstring); `rotary_dim`
    is the width of cos/sin (head_dim except under `first`). Under `longrope`, `inv_freq`
    is the short set and `long_inv_freq` the long one; each forward picks one (`frequencies`)."""

    inv_freq: torch.Tensor
    long_inv_freq: torch.Tensor | None

    def __init__(
        self,
        head_dim: int,
        base: float,
        scaling: RopeScaling,
        max_position: int,
        position_scale: float = 1.0,
        *,
        rotary_fraction: float = 1.0,
        partial_rotary: str = "first",
    ):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.base = base
        self.scaling = scaling
        self.max_position = max_position
        self.position_scale = position_scale
        self.rotary_fraction = rotary_fraction
        self.partial_rotary = partial_rotary
        self.attention_factor = cos_sin_factor(scaling, max_position)
        # Not persistent: derived from the config, so checkpoints stay config-independent.
        self.register_buffer("inv_freq", self.exact_frequencies(), persistent=False)
        long = self.exact_frequencies(long=True) if scaling.type == "longrope" else None
        self.register_buffer("long_inv_freq", long, persistent=False)
        self.forced_long: bool | None = None
        """longrope: the set every forward uses while `longrope_forced` holds it; None = by position."""

    @classmethod
    def of_model(
        cls, config: ModelConfig, base: float | None = None, scaling: RopeScaling | None = None
    ) -> RotaryEmbedding:
        """The RoPE of `config`'s layers: its head size, training length, position scale and
        partial rotation, with `base` and `scaling` (default: the full layers' rope_base and
        rope_scaling)."""
        return cls(
            config.head_size,
            base or config.rope_base,
            config.rope_scaling if scaling is None else scaling,
            config.max_position,
            config.rope_position_scale,
            rotary_fraction=config.rotary_fraction,
            partial_rotary=config.partial_rotary,
        )

    @property
    def partial(self) -> dict:
        """The partial-rotation arguments, for a RotaryEmbedding of another scaling or base."""
        return {"rotary_fraction": self.rotary_fraction, "partial_rotary": self.partial_rotary}

    def rescaled(self, scaling: RopeScaling) -> RotaryEmbedding:
        """This RoPE (head dim, base, training length, position scale, partial rotation)
        under `scaling` instead of its own (the ntk and yarn position methods)."""
        return RotaryEmbedding(
            self.head_dim, self.base, scaling, self.max_position, self.position_scale, **self.partial
        )

    @property
    def rotary_dim(self) -> int:
        """Channels of each head that cos/sin cover: 2 x the number of frequencies."""
        return 2 * self.inv_freq.shape[0]

    def exact_frequencies(self, long: bool = False) -> torch.Tensor:
        """theta_i in float32 on the CPU, computed from the constructor's arguments (`long`:
        longrope's long set), under partial rotation (module docstring): R/2 of them for
        `first` (R = int(p D)), D/2 for `p-rope` with the slowest D/2 - floor(p D / 2) set
        to 0. p = 1: `inverse_frequencies`, bitwise."""
        head_dim, fraction = self.head_dim, self.rotary_fraction
        arguments = (self.base, self.scaling, self.max_position, self.position_scale, long)
        if fraction == 1:
            return inverse_frequencies(head_dim, *arguments)
        if self.partial_rotary == "first":
            rotary_dim = int(head_dim * fraction)
            if rotary_dim <= 0 or rotary_dim % 2:
                raise ValueError(f"partial rotation: {fraction} x head_dim {head_dim} = {rotary_dim} channels")
            return inverse_frequencies(rotary_dim, *arguments)
        if self.partial_rotary == "p-rope":
            inv_freq = inverse_frequencies(head_dim, *arguments)
            inv_freq[int(fraction * head_dim // 2) :] = 0.0
            return inv_freq
        raise ValueError(f"partial_rotary {self.partial_rotary!r} is not one of ('first', 'p-rope')")

    def reset_frequencies(self, device: torch.device | str) -> None:
        """Set the frequency buffers to their exact float32 values on `device`."""
        self.inv_freq = self.exact_frequencies().to(device)
        if self.long_inv_freq is not None:
            self.long_inv_freq = self.exact_frequencies(long=True).to(device)

    def frequencies(self, position_ids: torch.Tensor) -> torch.Tensor:
        """The inverse frequencies a forward at `position_ids` rotates by: `inv_freq`, or under
        longrope the long set iff max(position_ids) + 1 > original_max_position (the whole
        forward, every row: transformers' rule), chosen by `torch.where` (no host sync)."""
        if self.long_inv_freq is None or position_ids.numel() == 0:
            return self.inv_freq
        if self.forced_long is not None:
            return self.long_inv_freq if self.forced_long else self.inv_freq
        original = self.scaling.original_max_position or self.max_position
        past = position_ids.max().to(self.inv_freq.device) + 1 > original
        return torch.where(past, self.long_inv_freq, self.inv_freq)

    def _apply(self, fn, recurse=True):
        """Moves follow the module; dtype casts do not. `model.to(torch.bfloat16)` (Lightning's
        `bf16-true`) would round theta_i to 8 mantissa bits, an angle error of m * theta_i * 2^-9
        (~0.4-0.9 rad at m = 2,047, tens of rad at 32K), so theta_i is recomputed in float32
        on the buffer's new device: bitwise the constructor's value, whatever `fn` did."""
        super()._apply(fn, recurse)
        self.reset_frequencies(self.inv_freq.device)
        return self

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [B, T] (any integers) -> cos, sin [B, T, rotary_dim] in the rotation's
        compute dtype `rotation_dtype(dtype)` (fp32; fp64 for fp64 inputs)."""
        compute = rotation_dtype(dtype)
        angles = position_ids.to(compute)[..., None] * self.frequencies(position_ids).to(position_ids.device, compute)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor


@contextmanager
def longrope_forced(model: torch.nn.Module, long: bool) -> Iterator[None]:
    """Every longrope RotaryEmbedding of `model` rotates by the long (or short) set inside the
    block, whatever a forward's positions: a prompt prefilled in chunks then rotates as one
    forward over the whole prompt would (the first chunks alone would choose short)."""
    rotaries = [m for m in model.modules() if isinstance(m, RotaryEmbedding) and m.long_inv_freq is not None]
    for rotary in rotaries:
        rotary.forced_long = long
    try:
        yield
    finally:
        for rotary in rotaries:
            rotary.forced_long = None


def rotation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype RoPE is computed in for inputs of `dtype`: fp32, or fp64 for fp64 inputs.

    The dtype rule at the attention boundary: q and k are rotated in this dtype and cast
    back to their own dtype (as Hugging Face Llama does), so under autocast (q/k/v from
    bf16 matmuls) and bf16-true alike every attention kernel receives q, k and v in one
    dtype; bf16 x fp32 cos/sin would otherwise promote q/k to fp32 next to a bf16 v."""
    wide = _ROTATION_DTYPES.get(dtype)
    return torch.promote_types(dtype, torch.float32) if wide is None else wide


_ROTATION_DTYPES = {
    torch.bfloat16: torch.float32,
    torch.float16: torch.float32,
    torch.float32: torch.float32,
    torch.float64: torch.float64,
}
"""`rotation_dtype` of the common dtypes without a dispatched `promote_types` (an aten
call per use, a measurable share of a decoding step: docs/benchmarks.md)."""


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, heads, head_dim] by cos/sin [B, T, R]: x cos + rotate_half(x) sin on
    the first R channels (R = head_dim but under `first` partial rotation, whose other
    channels pass through unchanged), computed in `rotation_dtype(x.dtype)` and returned in
    x's dtype (the dtype rule)."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        rotated = apply_rotary(x[..., :rotary_dim], cos, sin)
        return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)
    compute = rotation_dtype(x.dtype)
    cos = cos[:, :, None, :].to(compute)
    sin = sin[:, :, None, :].to(compute)
    wide = x.to(compute)
    return (wide * cos + rotate_half(wide) * sin).to(x.dtype)
