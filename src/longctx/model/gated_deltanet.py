"""The `linear` layer: Gated DeltaNet (Yang, Kautz & Hatamizadeh, ICLR 2025) as OLMo Hybrid and
Qwen3-Next compute it in transformers 5.23 (docs/design.md §5, "Linear layers").

For x [B, T, d] (the block's normed input):

    q, k, v = silu(causal_conv([x W_q, x W_k, x W_v]))      depthwise, K taps, per document
    beta = sigmoid(x W_b) (x 2 with allow_neg_eigval), g = -exp(A_log) softplus(x W_a + dt_bias)
    o = gated delta rule(l2norm(q) / sqrt(Dk), l2norm(k), v, g, beta)   (model/delta_rule.py)
    out = W_o [RMSNorm(o_h) w ⊙ silu(z_h)] per value head, z = x W_z

`olmo_hybrid` has separate projections (`q_proj`, `k_proj`, `v_proj`, `a_proj`, `b_proj`)
and the output gate `g_proj`, the gated norm's eps 1e-5 (fla's FusedRMSNormGated);
`qwen3_next` fuses them per key head h: `in_proj_qkvz` rows [q_h, k_h, v_h, z_h] with
n_value / n_key value heads each, `in_proj_ba` rows [b_h, a_h], its norm eps model.norm_eps.
The layer has no positions: RoPE, f(i) and the position methods never reach it.

Packed rows: the `Recurrence` of a forward marks where documents start, and both the
convolution and the recurrent state restart there. With a KV cache the layer keeps a
constant-size state (the last K - 1 convolution inputs and the [Hv, Dk, Dv] recurrent
state), continued by the next forward when its first token continues the row's document.
Where the delta rule runs: `model.linear_attention.kernel` (torch's chunked form, its
recurrent form for single-token steps, or fla's kernels, model/delta_rule_fla.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from longctx.batch import document_start_mask
from longctx.config.model import ModelConfig
from longctx.model.delta_rule import causal_conv, chunked_delta_rule, prepare_qk, recurrent_delta_rule
from longctx.model.delta_rule_fla import fla_delta_rule, use_fla


@dataclass
class Recurrence:
    """What a linear layer reads of one forward (built once, shared by the linear layers)."""

    starts: torch.Tensor
    """[B, T] bool: a document starts at this token, the states restart before it. Index 0
    is False only where the row continues the cached state (the same document)."""

    @classmethod
    def of(cls, document_ids: torch.Tensor, kv_cache=None, sharded: bool = False) -> Recurrence:
        """The states restart at every document start of `document_ids` [B, T]; a cached row
        continues its state where its first new token continues the last cached document."""
        if sharded:
            raise ValueError("linear (Gated DeltaNet) layers do not run under a sequence shard (context parallelism)")
        starts = document_start_mask(document_ids)
        if kv_cache is not None and kv_cache.length:
            starts[:, 0] = document_ids[:, 0] != kv_cache.continued_documents(document_ids.shape[0], 1)[:, 0]
        return cls(starts)


class GatedDeltaNet(nn.Module):
    """One `linear` layer (module docstring). Parameter names are transformers' for the
    variant; `wo` is the output projection (transformers' `o_proj` / `out_proj`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        spec = config.linear_attention
        self.variant, self.chunk_size, self.kernel = spec.variant, spec.chunk_size, spec.kernel
        self.n_key, self.n_value, self.key_dim, self.value_dim = spec.heads(config.n_heads, config.head_size)
        self.neg_eigval = spec.allow_neg_eigval
        keys, values, d = self.n_key * self.key_dim, self.n_value * self.value_dim, config.d_model
        if self.variant == "olmo_hybrid":
            self.q_proj = nn.Linear(d, keys, bias=False)
            self.k_proj = nn.Linear(d, keys, bias=False)
            self.v_proj = nn.Linear(d, values, bias=False)
            self.a_proj = nn.Linear(d, self.n_value, bias=False)
            self.b_proj = nn.Linear(d, self.n_value, bias=False)
            self.g_proj = nn.Linear(d, values, bias=False)
            self.norm_eps = 1e-5
        else:
            self.in_proj_qkvz = nn.Linear(d, 2 * keys + 2 * values, bias=False)
            self.in_proj_ba = nn.Linear(d, 2 * self.n_value, bias=False)
            self.norm_eps = config.norm_eps
        channels = 2 * keys + values
        self.conv_weight = nn.Parameter(torch.empty(channels, 1, spec.conv_size))
        """Depthwise convolution taps [C, 1, K] over [q, k, v] (nn.Conv1d's layout)."""
        self.A_log = nn.Parameter(torch.empty(self.n_value))
        self.dt_bias = nn.Parameter(torch.empty(self.n_value))
        self.norm_weight = nn.Parameter(torch.ones(self.value_dim))
        """The gated RMSNorm's weight over each value head (a plain weight, also in Qwen3-Next)."""
        self.wo = nn.Linear(values, d, bias=False)
        self.reset_recurrence_parameters()

    def reset_recurrence_parameters(self) -> None:
        """The convolution as nn.Conv1d initialises it (uniform in ±1/sqrt(K)), A uniform in
        [0.01, 16] (transformers' Qwen3-Next; OLMo Hybrid's [0, 16] less log(0) = -inf), and
        dt_bias = softplus^-1(dt), dt log-uniform in [0.001, 0.1] floored at 1e-4 (Mamba-2's;
        OLMo Hybrid's defaults)."""
        with torch.no_grad():
            bound = 1 / math.sqrt(self.conv_weight.shape[-1])
            self.conv_weight.uniform_(-bound, bound)
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(0.01, 16).log())
            dt = torch.exp(torch.rand_like(self.dt_bias) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
            dt = dt.clamp(min=1e-4)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            self.norm_weight.fill_(1.0)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [N, d] -> (q, k, v [N, channels], z [N, Hv, Dv], b, a [N, Hv])."""
        if self.variant == "olmo_hybrid":
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            z = self.g_proj(x).view(-1, self.n_value, self.value_dim)
            return q, k, v, z, self.b_proj(x), self.a_proj(x)
        group = self.n_value // self.n_key
        rows = [self.key_dim, self.key_dim, group * self.value_dim, group * self.value_dim]
        q, k, v, z = self.in_proj_qkvz(x).view(-1, self.n_key, sum(rows)).split(rows, -1)
        b, a = self.in_proj_ba(x).view(-1, self.n_key, 2 * group).split(group, -1)
        return (
            q.reshape(-1, self.n_key * self.key_dim),
            k.reshape(-1, self.n_key * self.key_dim),
            v.reshape(-1, self.n_value * self.value_dim),
            z.reshape(-1, self.n_value, self.value_dim),
            b.reshape(-1, self.n_value),
            a.reshape(-1, self.n_value),
        )

    def forward(
        self,
        x: torch.Tensor,
        recurrence: Recurrence,
        layer: int,
        kv_cache=None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [B, T, d] -> [B, T, d] (plus `residual` when given, as `Attention` does)."""
        batch, seq, _ = x.shape
        q, k, v, z, b, a = self.projections(x.reshape(batch * seq, -1))
        conv_state, state = kv_cache.linear_state(layer) if kv_cache is not None else (None, None)
        mixed = torch.cat([q, k, v], -1).view(batch, seq, -1)
        mixed, conv_state = causal_conv(mixed, self.conv_weight[:, 0], recurrence.starts, conv_state)
        keys = self.n_key * self.key_dim
        q, k, v = mixed.split([keys, keys, self.n_value * self.value_dim], -1)
        q, k = q.view(batch, seq, self.n_key, self.key_dim), k.view(batch, seq, self.n_key, self.key_dim)
        v = v.reshape(batch, seq, self.n_value, self.value_dim)
        beta = b.view(batch, seq, -1).sigmoid() * (2.0 if self.neg_eigval else 1.0)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        g = -self.A_log.to(dtype).exp() * F.softplus(a.view(batch, seq, -1).to(dtype) + self.dt_bias.to(dtype))
        if use_fla(self.kernel, x):
            out, state = fla_delta_rule(q, k, v, g, beta, recurrence.starts, state)
        else:
            q, k = prepare_qk(q, k, self.n_value)
            if seq == 1 and state is not None:
                out, state = recurrent_delta_rule(q, k, v, g, beta, recurrence.starts, state)
            else:
                out, state = chunked_delta_rule(q, k, v, g, beta, recurrence.starts, state, self.chunk_size)
        if kv_cache is not None:
            kv_cache.store_linear(layer, conv_state, state)
        out = self.gated_norm(out.reshape(batch * seq, self.n_value, self.value_dim), z).reshape(batch * seq, -1)
        if residual is not None:
            return torch.addmm(residual.reshape(batch * seq, -1), out, self.wo.weight.t()).view(batch, seq, -1)
        return self.wo(out).view(batch, seq, -1)

    def gated_norm(self, out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """RMSNorm(o) w ⊙ silu(z) per value head: normalised in fp32, times the weight in the
        input's dtype, the gate in fp32 (transformers' RMSNormGated, norm before gate)."""
        dtype = out.dtype
        wide = out.to(torch.float64 if dtype == torch.float64 else torch.float32)
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        normed = self.norm_weight * normed.to(dtype)
        return (normed * F.silu(z.to(wide.dtype))).to(dtype)
