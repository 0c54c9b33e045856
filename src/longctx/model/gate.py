"""Gated attention: the attention output times a sigmoid gate of the layer's input.

Qiu et al. (2025), "Gated Attention for Large Language Models", §3 (position G1, after
the scaled dot-product attention, before the output projection): for the attention
output o_h of head h at a token whose input to the attention is x,

    elementwise:  o_h <- o_h * sigmoid(x W_g,h)       W_g,h: [head_dim, d_model], one gate a channel
    head:         o_h <- o_h * sigmoid(x w_g,h)       w_g,h: [1, d_model], one gate a head

`elementwise` is Qwen3-Next's (transformers' Qwen3NextAttention: q_proj of 2 x n_heads x
head_dim rows, each head's head_dim query rows followed by its head_dim gate rows; a
checkpoint importer splits them into `wq` and `wg`). Why: the paper reports that the
gate's query-dependent sparsity removes the attention sink and the massive activations,
and helps extrapolation; f(i) is unchanged, since the gate acts after the softmax and
moves no position.

The gate reads the same normed input as q/k/v, so training, prefill and cached decoding
apply it alike, on every attention backend and position method: it multiplies the
output those return.
"""

from __future__ import annotations

import torch


def gated(out: torch.Tensor, gate: torch.Tensor, heads: int) -> torch.Tensor:
    """out [N, heads x head_dim] times sigmoid(gate), gate [N, heads x head_dim]
    (elementwise) or [N, heads] (one value a head), in out's dtype."""
    weights = torch.sigmoid(gate.to(out.dtype))
    if gate.shape[-1] == out.shape[-1]:
        return out * weights
    return (out.view(out.shape[0], heads, -1) * weights[..., None]).view(out.shape)


def split_gated_query(weight: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next's doubled q_proj weight (or bias) [heads x 2 x head_dim, ...] -> (wq, wg),
    each [heads x head_dim, ...]: per head, head_dim query rows then head_dim gate rows
    (transformers' `torch.chunk(q_proj(x).view(..., heads, 2 * head_dim), 2, dim=-1)`)."""
    per_head = weight.reshape(heads, 2, -1, *weight.shape[1:])
    rest = weight.shape[1:]
    return per_head[:, 0].reshape(-1, *rest), per_head[:, 1].reshape(-1, *rest)
