"""A float64 forward of longctx's decoder written from the formulas, loop by loop, for the
per-layer designs (sliding windows with their own RoPE base, NoPE layers): what the model
under test must equal. It reads only the weights and `ModelConfig.layer_specs()`; masks
are built pair by pair (same document, key not after the query, fewer than W keys back),
RoPE from theta_i = base^(-2i/D) on the rotate-half layout; attention sinks as one more
softmax column whose probability is dropped (gpt-oss); attention temperature as a factor
on the rotated queries, position by position from its formula; the output gate (Qiu et al.
2025, G1) as sigmoid of the normed input's gate projection times the attention output."""

from __future__ import annotations

import math

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """x [B, T, H, D] rotated at positions [B, T]: pairs (i, i + D/2) by position x theta_i."""
    dim = x.shape[-1]
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.double()[..., None, None] * theta  # [B, T, 1, D/2]
    first, second = x[..., : dim // 2], x[..., dim // 2 :]
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def allowed(document_ids: torch.Tensor, window: int) -> torch.Tensor:
    """[B, T, T] booleans, pair by pair."""
    batch, length = document_ids.shape
    out = torch.zeros(batch, length, length, dtype=torch.bool)
    for b in range(batch):
        for i in range(length):
            for j in range(i + 1):
                near = window == 0 or i - j < window
                out[b, i, j] = bool(document_ids[b, i] == document_ids[b, j]) and near
    return out


def temperature(config, position: int, rope: bool, window: int) -> float:
    """The query factor at `position`: 1, Llama 4's log(floor((p + 1) / floor_scale) + 1) *
    attn_scale + 1, or SSMax's s ln n with n = p + 1 keys seen (at most W on a sliding layer)."""
    t = config.attn_temperature
    layers = t.layers if t.layers != "auto" else ("nope" if t.type == "llama4" else "all")
    if t.type == "none" or (layers == "nope" and rope):
        return 1.0
    if t.type == "llama4":
        return math.log(math.floor((position + 1) / t.floor_scale) + 1) * t.attn_scale + 1
    keys = position + 1 if not window else min(position + 1, window)
    return (t.ssmax_s or 1 / math.log(config.max_position)) * math.log(keys)


def reference_logits(model, input_ids, position_ids=None, document_ids=None) -> torch.Tensor:
    """The model's logits [B, T, vocab] in float64 from its weights and layer designs."""
    config = model.config
    batch, length = input_ids.shape
    if position_ids is None:
        position_ids = torch.arange(length).expand(batch, length)
    if document_ids is None:
        document_ids = torch.zeros(batch, length, dtype=torch.long)
    weights = {name: tensor.detach().double() for name, tensor in model.state_dict().items()}
    x = weights["tok_embeddings.weight"][input_ids]
    heads, kv_heads, dim = config.n_heads, config.n_kv_heads, config.head_size
    for index, spec in enumerate(config.layer_specs()):
        p = f"blocks.{index}."
        h = rms_norm(x, weights[p + "attn_norm.weight"], config.norm_eps)
        q = (h @ weights[p + "attn.wq.weight"].T).view(batch, length, heads, dim)
        k = (h @ weights[p + "attn.wk.weight"].T).view(batch, length, kv_heads, dim)
        v = (h @ weights[p + "attn.wv.weight"].T).view(batch, length, kv_heads, dim)
        if spec.rope:
            q, k = rope(q, position_ids, spec.rope_base), rope(k, position_ids, spec.rope_base)
        factors = [[temperature(config, int(p), spec.rope, spec.window) for p in row] for row in position_ids]
        q = q * torch.tensor(factors, dtype=torch.float64)[:, :, None, None]
        k = k.repeat_interleave(heads // kv_heads, dim=2)
        v = v.repeat_interleave(heads // kv_heads, dim=2)
        scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dim)
        scores = scores.masked_fill(~allowed(document_ids, spec.window)[:, None], float("-inf"))
        if config.attention_sinks:  # one more column per head, no value
            sink = weights[p + "attn.sinks"].view(1, heads, 1, 1).expand(batch, heads, length, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        out = torch.einsum("bhij,bjhd->bihd", probs, v).reshape(batch, length, heads * dim)
        if config.attention_gate != "none":  # Qiu et al. 2025 G1: out * sigmoid(h W_g), a channel or a head
            gate = torch.sigmoid(h @ weights[p + "attn.wg.weight"].T)
            out = out * (gate if config.attention_gate == "elementwise" else gate.repeat_interleave(dim, -1))
        x = x + out @ weights[p + "attn.wo.weight"].T
        h = rms_norm(x, weights[p + "mlp_norm.weight"], config.norm_eps)
        gate, up = h @ weights[p + "mlp.gate.weight"].T, h @ weights[p + "mlp.up.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ weights[p + "mlp.down.weight"].T
    return rms_norm(x, weights["norm.weight"], config.norm_eps) @ weights["output.weight"].T
