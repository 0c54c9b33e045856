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

On top of any scaling, `position_scale` s multiplies every theta_i (model.rope_position_scale):
the angle at distance i becomes i * s * theta_i, so a window of L tokens has the angles of
an L * s window under plain RoPE. The miniature replication (docs/design.md §13) uses it
to make distance harder to ignore: with base 10,000 and head_dim 32 a 512-token window
leaves 8 of 16 pairs short of one full turn; s = 2 leaves 7, s = 4 leaves 5. The fastest pair turns
s * 1 rad per token, so for s > pi it aliases (an offset of 1 reads like 1 - 2 pi / s):
that pair no longer orders neighbours, the slower pairs still do. s = 1 is bitwise plain RoPE.

Channel layout is the Hugging Face one ("rotate half": channel i pairs with i + d/2),
so exported weights need no permutation.
"""

from __future__ import annotations

import math

import torch

from longctx.config.model import ROPE_SCALING_TYPES, RopeScaling

__all__ = [
    "ROPE_SCALING_TYPES",
    "RopeScaling",
    "RotaryEmbedding",
    "apply_rotary",
    "inverse_frequencies",
    "rotate_half",
    "rotation_dtype",
]


def yarn_attention_factor(scaling: RopeScaling) -> float:
    """YaRN's cos/sin multiplier (the square root of the attention temperature, §3.4)."""
    if scaling.attention_factor > 0:
        return scaling.attention_factor
    if scaling.factor <= 1:
        return 1.0
    return 0.1 * math.log(scaling.factor) + 1.0


def inverse_frequencies(
    head_dim: int, base: float, scaling: RopeScaling, max_position: int, position_scale: float = 1.0
) -> torch.Tensor:
    """theta_i for i in [0, head_dim/2), float32, under the given scaling, times `position_scale`."""
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
    """Computes cos/sin for arbitrary position ids; `apply_rotary` rotates q and k."""

    inv_freq: torch.Tensor

    def __init__(
        self, head_dim: int, base: float, scaling: RopeScaling, max_position: int, position_scale: float = 1.0
    ):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.base = base
        self.scaling = scaling
        self.max_position = max_position
        self.position_scale = position_scale
        self.attention_factor = yarn_attention_factor(scaling) if scaling.type == "yarn" else 1.0
        # Not persistent: derived from the config, so checkpoints stay config-independent.
        self.register_buffer(
            "inv_freq", inverse_frequencies(head_dim, base, scaling, max_position, position_scale), persistent=False
        )

    def _apply(self, fn, recurse=True):
        """Moves follow the module; dtype casts do not. `model.to(torch.bfloat16)` (Lightning's
        `bf16-true`) would round theta_i to 8 mantissa bits, an angle error of m * theta_i * 2^-9
        (~0.4-0.9 rad at m = 2,047, tens of rad at 32K), so theta_i is recomputed in float32
        on the buffer's new device: bitwise the constructor's value, whatever `fn` did."""
        super()._apply(fn, recurse)
        exact = inverse_frequencies(self.head_dim, self.base, self.scaling, self.max_position, self.position_scale)
        self.inv_freq = exact.to(self.inv_freq.device)
        return self

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [B, T] (any integers) -> cos, sin [B, T, head_dim] in the rotation's
        compute dtype `rotation_dtype(dtype)` (fp32; fp64 for fp64 inputs)."""
        compute = rotation_dtype(dtype)
        angles = position_ids.to(compute)[..., None] * self.inv_freq.to(position_ids.device, compute)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor


def rotation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype RoPE is computed in for inputs of `dtype`: fp32, or fp64 for fp64 inputs.

    The dtype rule at the attention boundary: q and k are rotated in this dtype and cast
    back to their own dtype (as Hugging Face Llama does), so under autocast (q/k/v from
    bf16 matmuls) and bf16-true alike every attention kernel receives q, k and v in one
    dtype; bf16 x fp32 cos/sin would otherwise promote q/k to fp32 next to a bf16 v."""
    return torch.promote_types(dtype, torch.float32)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, heads, head_dim] by cos/sin [B, T, head_dim]: x cos + rotate_half(x) sin,
    computed in `rotation_dtype(x.dtype)` and returned in x's dtype (the dtype rule)."""
    compute = rotation_dtype(x.dtype)
    cos = cos[:, :, None, :].to(compute)
    sin = sin[:, :, None, :].to(compute)
    wide = x.to(compute)
    return (wide * cos + rotate_half(wide) * sin).to(x.dtype)
