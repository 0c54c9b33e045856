"""The `linear` layers' configuration: Gated DeltaNet (Yang, Kautz & Hatamizadeh, ICLR 2025).

    model:
      layer_types: [linear, linear, linear, full]    # or: linear_attention.full_every: 4
      linear_attention: {variant: qwen3_next, n_key_heads: 2, n_value_heads: 4}

A `linear` layer (model/gated_deltanet.py) replaces attention by a recurrent state
S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T of n_value_heads matrices
of key_head_dim x value_head_dim, read by o_t = S_t q_t; it has no positions, so RoPE,
f(i) and the position methods concern the other layers only. The two variants are the
layouts transformers 5.23 computes: `olmo_hybrid` (OLMo Hybrid: separate q/k/v/a/b
projections, an output gate `g_proj`, beta x 2 with `allow_neg_eigval`) and `qwen3_next`
(Qwen3-Next: the fused `in_proj_qkvz` / `in_proj_ba` grouped per key head, more value heads
than key heads). This module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from longctx.config.checks import boolean, choice, positive_int
from longctx.errors import ConfigError

LINEAR_VARIANTS = ("olmo_hybrid", "qwen3_next")
"""Values of `model.linear_attention.variant` (see the module docstring)."""

LINEAR_KERNELS = ("torch", "fla", "auto")
"""Values of `model.linear_attention.kernel`: the delta rule in torch (chunked, any device),
in flash-linear-attention's Triton kernels (CUDA, the `fla` extra), or fla where it is
installed and the input is on CUDA, else torch (`auto`)."""


@dataclass
class LinearAttention:
    """Gated DeltaNet layers (`model.layer_types` entries `linear`). Head counts and sizes of 0
    take the attention layers' (n_heads, head_dim); value heads of 0 take the key heads'."""

    variant: str = "olmo_hybrid"
    """olmo_hybrid | qwen3_next: the projection layout (see LINEAR_VARIANTS)."""
    full_every: int = 0
    """k > 0: every k-th layer (layers k-1, 2k-1, ...) is full attention, the others linear
    (OLMo Hybrid and Qwen3-Next: 4, three linear to one full). Exclusive with
    `model.layer_types` and `model.global_every`."""
    n_key_heads: int = 0
    """Query/key heads (transformers' `linear_num_key_heads`); 0 = model.n_heads."""
    n_value_heads: int = 0
    """Value heads and recurrent states (`linear_num_value_heads`); a multiple of
    n_key_heads, each key head serving n_value_heads / n_key_heads consecutive value heads
    (Qwen3-Next: 32 of 16); 0 = n_key_heads."""
    key_head_dim: int = 0
    """Channels of each query/key head (`linear_key_head_dim`); 0 = model.head_dim."""
    value_head_dim: int = 0
    """Channels of each value head (`linear_value_head_dim`); 0 = key_head_dim."""
    conv_size: int = 4
    """Width K of the causal depthwise convolution over q, k and v (`linear_conv_kernel_dim`):
    a token mixes itself and the K - 1 tokens before it in its document."""
    allow_neg_eigval: bool = False
    """olmo_hybrid: beta = 2 sigmoid(b), in (0, 2), so I - beta k k^T may have a negative
    eigenvalue (Grazzi et al., ICLR 2025: state tracking); transformers' `linear_allow_neg_eigval`."""
    chunk_size: int = 64
    """Tokens per chunk of the torch chunked form (the WY/UT transform inside a chunk, the
    state passed between chunks; transformers' and fla's 64)."""
    kernel: str = "torch"
    """torch | fla | auto: where the delta rule runs (see LINEAR_KERNELS)."""
    norm_placement: str = ""
    """pre | sandwich | post: where the linear layers' block norms sit, when not where
    `model.norm_placement` puts the other layers' ('' = the same). OLMo Hybrid: `pre` (its
    linear layers are Llama blocks, its attention layers OLMo 3's post-norm blocks)."""

    def validate(self, prefix: str = "model.linear_attention") -> None:
        choice(f"{prefix}.variant", self.variant, LINEAR_VARIANTS)
        choice(f"{prefix}.kernel", self.kernel, LINEAR_KERNELS)
        choice(f"{prefix}.norm_placement", self.norm_placement, ("", "pre", "sandwich", "post"))
        for name in ("full_every", "n_key_heads", "n_value_heads", "key_head_dim", "value_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{prefix}.{name}", f"must be a non-negative integer, got {value!r}")
        for name in ("conv_size", "chunk_size"):
            positive_int(f"{prefix}.{name}", getattr(self, name))
        boolean(f"{prefix}.allow_neg_eigval", self.allow_neg_eigval)
        if self.allow_neg_eigval and self.variant != "olmo_hybrid":
            raise ConfigError(f"{prefix}.allow_neg_eigval", f"is olmo_hybrid's; variant is {self.variant!r}")

    def heads(self, n_heads: int, head_dim: int) -> tuple[int, int, int, int]:
        """(key heads, value heads, key head dim, value head dim), the zeros resolved."""
        n_key = self.n_key_heads or n_heads
        key_dim = self.key_head_dim or head_dim
        return n_key, self.n_value_heads or n_key, key_dim, self.value_head_dim or key_dim

    def check_heads(self, n_heads: int, head_dim: int, prefix: str = "model.linear_attention") -> None:
        n_key, n_value, _, _ = self.heads(n_heads, head_dim)
        if n_value % n_key:
            raise ConfigError(
                f"{prefix}.n_value_heads",
                f"{n_value} is not a multiple of n_key_heads={n_key}",
                (f"{prefix}.n_key_heads",),
            )

    def num_parameters(self, d_model: int, n_heads: int, head_dim: int) -> int:
        """Parameters of one linear layer (projections, convolution, A_log, dt_bias, the
        gated norm and the output projection)."""
        n_key, n_value, key_dim, value_dim = self.heads(n_heads, head_dim)
        keys, values = n_key * key_dim, n_value * value_dim
        projections = d_model * (2 * keys + 2 * values + 2 * n_value)  # q, k, v, gate (z / g), a, b
        return projections + (2 * keys + values) * self.conv_size + 2 * n_value + value_dim + values * d_model
