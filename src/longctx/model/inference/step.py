"""One cached decoding step: few operations, no host sync (docs/design.md §8, "The KV cache").

A decoding step (one new token per row over a KV cache) is bound on a GPU by Python
dispatch and by host syncs, not by arithmetic. This module holds what the model builds
once per step and every layer reads:

- `DecodeKeys`: where the new token finds its keys. The full layers read the whole
  preallocated buffer ([B, max_len], a fixed shape); the keys a row may see are
  [document start, new index], both on the device (the cache keeps each row's current
  document start and the step's index as tensors), so nothing is read back to the host.
- `DecodeMask`: for each pass of the step (one for RoPE, two for StRing), which keys of
  the read are seen: a boolean [B, P, Tk] and the additive form (0 or the dtype's lowest
  finite value) the fused CPU kernel takes. A finite "minus infinity" makes a pass that
  sees no key (StRing's shifted pass early on) a row of weight exp(min - lse) = 0 in the
  merge, with no separate fix-up of its log-sum-exp.
- `Step`: one layer design's rotations and attention in the step (model/layer_attention.py
  decides which). `rotate`: RoPE on the step's q or k with cos/sin computed once for all layers, as
  x cos + roll(x, R/2) sin', sin' = [-sin_1, sin_2] (bitwise `rope.apply_rotary`:
  rotate_half(x) sin = roll(x, R/2) sin').
- `decode_attention`: every pass in one kernel call, the queries of the P passes as P
  query rows with their own masks (a query's softmax over the union of its passes is the
  merge of each pass's softmax by log-sum-exp, STRING Algorithm 2: weights softmax(lse)
  over the passes, one matmul). GQA is read natively, k/v never copied per query head:
  on CPU torch's fused kernel takes fewer key/value heads; elsewhere (fp64, no Triton)
  `_attend_math` folds each key/value head's query group into its query rows (sdpa with
  a mask and fewer k/v heads would run its math kernel, which expands k/v). On CUDA, for
  a cache that carries the kernel's buffers (`eval.cuda_decoding` kernel | graph+kernel),
  one Triton kernel (model/inference/kernel.py) computes the union softmax of all passes
  directly: no merge operations, one launch per layer for RoPE and StRing alike.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from longctx.model.inference import kernel as decode_kernel
from longctx.model.rope import rotation_dtype
from longctx.model.sinks import dense_with_sinks
from longctx.model.temperature import tempered

wide = rotation_dtype
"""The merge dtype of an activation dtype: fp32, fp64 for fp64 (rope.rotation_dtype)."""


@dataclass
class DecodeKeys:
    """The keys of one decoding step, built once per step from the cache."""

    index: torch.Tensor
    """[1] the new token's key index (the cache's length before the step), on the device."""
    document_start: torch.Tensor
    """[B] the key index where each row's current document starts."""
    key_index: torch.Tensor
    """[max_len] 0..max_len-1, the cache's (allocated once)."""
    held: int
    """Sliding layers: keys read = the kept ones + the new (host int, cache bookkeeping)."""
    kernel: decode_kernel.KernelBuffers | None = None
    """The cache's decoding-kernel buffers; None: the step's attention runs in torch's kernels."""

    def allowed(self, bands: list[tuple[int, int | None]], span: int | None = None) -> torch.Tensor:
        """[B, P, Tk] boolean: key j of the read seen by pass p (distances [nearest,
        farthest] within the row's document). `span`: a sliding layer's read of `span` keys
        ending at the new one; None: the whole buffer."""
        keys = self.key_index if span is None else self.key_index[:span] + (self.index + 1 - span)
        passes = []
        for nearest, farthest in bands:
            lower = (
                self.document_start if farthest is None else torch.maximum(self.document_start, self.index - farthest)
            )
            seen = keys >= lower[:, None]
            passes.append(seen & (keys <= self.index - nearest) if nearest or span is None else seen)
        return torch.stack(passes, dim=1) if len(passes) > 1 else passes[0][:, None]


@dataclass
class DecodeMask:
    """One layer design's pass masks for a step (module docstring)."""

    allowed: torch.Tensor
    """[B, P, Tk] boolean."""
    dtype: torch.dtype
    """The activations' dtype, the additive form's."""
    kernel: decode_kernel.KernelBuffers | None = None
    """Where the decoding kernel writes (the cache's, `DecodeKeys.kernel`); None: torch's
    kernels. It rides with the mask because the mask is what every attention call of the
    step already receives from the step's plan: the decision reaches `decode_attention`
    from the generation that made the cache, with no flag shared between generations."""

    @functools.cached_property
    def bias(self) -> torch.Tensor:
        """[B, 1, P, Tk] 0 or the lowest finite value, built on first use: once per step
        for every layer of the design, never where the decoding kernel reads `allowed`."""
        bias = self.allowed.logical_not().to(self.dtype).mul_(torch.finfo(self.dtype).min)
        return bias[:, None]


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """[-sin_1, sin_2] of sin [..., R] = [sin_1, sin_2]: roll(x, R/2) times it is
    rotate_half(x) times sin."""
    first, second = sin.chunk(2, dim=-1)
    return torch.cat([-first, second], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, D] rotated by cos/sin' [B, T or P, R] (sin' from `signed_sin`), in
    cos's dtype, returned in x's: [B, P, heads, D] when cos has P rows per row of x (T =
    1). Partial rotation (`first`, R < D): the other channels pass through."""
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        part = rotate(x[..., :rotary], cos, sin)
        rest = x[..., rotary:].expand(*part.shape[:-1], -1)
        return torch.cat([part, rest], dim=-1)
    rolled = x.roll(rotary // 2, dims=-1)
    out = x * cos[:, :, None] + rolled * sin[:, :, None]
    return out if out.dtype == x.dtype else out.to(x.dtype)


def joined(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q [B, T, H, D] and k [B, T, Hkv, D] as one tensor of H + Hkv heads: a view when k's
    heads follow q's in memory with the same strides (the column blocks of one fused q/k/v
    matmul, model/layers.py), else a copy."""
    heads = q.shape[2]
    if (
        q.shape[:2] == k.shape[:2]
        and all(a == b or size == 1 for a, b, size in zip(q.stride(), k.stride(), q.shape, strict=True))
        and q.dtype == k.dtype
        and q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
        and k.data_ptr() == q.data_ptr() + heads * q.stride(2) * q.element_size()
    ):
        return q.as_strided((*q.shape[:2], heads + k.shape[2], q.shape[3]), q.stride())
    return torch.cat([q, k], dim=2)


def decode_attention(
    queries: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: DecodeMask,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """queries [B, P, H, D] (pass p's rotated query of each row), k/v [B, Tk, Hkv, D] ->
    [B, 1, H, D]: the softmax over the union of the passes' keys (module docstring)."""
    passes = queries.shape[1]
    q4, k4, v4 = queries.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if sinks is not None:
        if passes != 1:
            raise ValueError("attention sinks take one pass")
        return dense_with_sinks(q4, k4, v4, mask.allowed[:, None], scale, sinks).transpose(1, 2)
    # CUDA, where the cache opted in: every pass and the merge in one launch (its products take one dtype)
    if mask.kernel is not None and queries.dtype == k.dtype == v.dtype and decode_kernel.usable(queries):
        return decode_kernel.decode_attend(queries, k, v, mask.allowed, scale, mask.kernel)
    if queries.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q4, k4, v4, 0.0, False, attn_mask=mask.bias, scale=scale
        )
    else:  # sdpa with a mask and fewer k/v heads falls back to its math kernel, which copies k/v per head
        out, lse = _attend_math(q4, k4, v4, mask.bias, scale)
    if passes == 1:
        return out.transpose(1, 2).to(queries.dtype)
    compute = wide(queries.dtype)
    weights = torch.softmax(lse.to(compute), dim=-1)[..., None]  # [B, H, P, 1]
    # out [B, H, P, D] in the activations' dtype: the product promotes it to the merge
    # dtype in the same operation, and a sum over P (not a matmul) reads it in any layout
    merged = (weights * out).sum(dim=2, keepdim=True)  # [B, H, 1, D]
    return merged.transpose(1, 2).to(queries.dtype)


def _attend_math(q, k, v, bias, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, P, D] over k/v [B, Hkv, Tk, D] with bias [B, 1, P, Tk], GQA without copies
    (the group folded into the query rows); k and v are read in their own dtype (the
    matmuls accumulate in fp32), scores, softmax and lse in fp32, as transformers' eager
    attention: out [B, H, P, D] in v's dtype and lse [B, H, P] fp32."""
    batch, heads, passes, dim = q.shape
    kv_heads = k.shape[1]
    compute = wide(q.dtype)
    grouped = q.reshape(batch, kv_heads, heads // kv_heads * passes, dim)
    scores = torch.matmul(grouped, k.transpose(2, 3)).to(compute) * scale
    scores = scores.view(batch, kv_heads, heads // kv_heads, passes, -1) + bias[:, :, None].to(compute)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    weights = torch.exp(scores - lse).flatten(2, 3).to(v.dtype)
    out = torch.matmul(weights, v).view(batch, heads, passes, dim)
    return out, lse.view(batch, heads, passes)


@dataclass
class Step:
    """One layer design's attention in a decoding step (the `Positions` that
    model/layer_attention.py decides): q rotated once per pass P ([B, P, H, D]; cos and
    sin' [B, P, R] of the pass's query positions, sin' from `signed_sin`, times a method's
    query scale), the new key at its own position, then the queries times the
    temperature `factor`; every pass in one `decode_attention` call, scores times
    `score_multiplier`. Plain RoPE is one pass, NoPE no rotation (`query_cos` None).

    Without `key_cos` (plain RoPE; rope, ntk, yarn and StRing, whose first pass rotates
    queries at their own positions unscaled) k rotates with the queries as one tensor of
    H + Hkv heads and takes the first pass's row: one set of operations, no angles of
    its own."""

    mask: DecodeMask
    query_cos: torch.Tensor | None = None
    query_sin: torch.Tensor | None = None
    key_cos: torch.Tensor | None = None
    key_sin: torch.Tensor | None = None
    score_multiplier: float = 1.0
    factor: torch.Tensor | None = None
    """[B, 1, 1, 1] the temperature's (model/temperature.py); None: no temperature."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.query_cos is not None and self.query_sin is not None:
            if self.key_cos is None or self.key_sin is None:
                heads = q.shape[2]
                both = rotate(joined(q, k), self.query_cos, self.query_sin)  # [B, P, H + Hkv, D]
                q, k = both[:, :, :heads], both[:, :1, heads:]
            else:
                q, k = rotate(q, self.query_cos, self.query_sin), rotate(k, self.key_cos, self.key_sin)
        return tempered(q, self.factor), k

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        return decode_attention(q, k, v, self.mask, q.shape[-1] ** -0.5 * self.score_multiplier, sinks)
