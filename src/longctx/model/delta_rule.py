"""The gated delta rule and the short convolution of a Gated DeltaNet layer, in torch, with
document resets (docs/design.md §5, "Linear layers").

Gated DeltaNet (Yang, Kautz & Hatamizadeh, ICLR 2025, Eq. 10): per value head, a state S of
key_dim x value_dim channels, and for each token t

    S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t k_t v_t^T        (written k ⊗ v)
    o_t = S_t^T q_t

with q_t, k_t L2-normalised (q_t also times key_dim^-1/2), g_t <= 0 the log decay and beta_t
the write strength. Packed rows hold several documents: where a document starts the state
is reset (S_{t-1} := 0) and the convolution sees no token of the document before, so each
document runs as if alone (tested against each document run alone).

- `recurrent_delta_rule`: the recurrence token by token (decoding steps; the reference).
- `chunked_delta_rule`: the same in chunks of C tokens (§3.3, the WY/UT form of DeltaNet,
  Yang et al., NeurIPS 2024): inside a chunk, with Γ_ij = exp(G_i - G_j) for j <= i in one
  document (G the cumulative log decay in the chunk) and 0 otherwise, the UT transform
  T = (I + tril(diag(beta) K K^T ⊙ Γ, -1))^-1 gives the chunk's pseudo-values
  U = T diag(beta) V and the state reads W = T diag(beta) (K ⊙ exp(G) carried); then
  V' = U - W S, O = (Q ⊙ exp(G) carried) S + (Q K^T ⊙ Γ) V' and
  S <- exp(G_C) S [no start in the chunk] + (K ⊙ exp(G_C - G) [in the last document])^T V'.
  "carried" marks the tokens whose document began before the chunk (they see S).
- `causal_conv`: out_t = silu(sum_s w_s x_{t-K+1+s}) over the tokens of t's document, with
  the K - 1 inputs before the forward (the decoding state) in front.

Everything computes in float32 (float64 for float64 inputs, the tests' references) and
returns the values' dtype, as transformers' torch fallbacks and fla's kernels do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def prepare_qk(q: torch.Tensor, k: torch.Tensor, value_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, T, Hk, Dk] -> L2-normalised (x / sqrt(sum x^2 + 1e-6), fla's and transformers'
    eps), q times Dk^-1/2, each key head repeated for its value heads -> [B, T, Hv, Dk]."""
    dtype = _compute_dtype(q)
    q, k = q.to(dtype), k.to(dtype)
    q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * q.shape[-1] ** -0.5
    k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
    groups = value_heads // k.shape[2]
    if groups > 1:
        q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
    return q, k


def recurrent_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    starts: torch.Tensor,
    state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, T, H, Dk] (prepared), v [B, T, H, Dv], g, beta [B, T, H], starts [B, T] (True:
    the state resets before this token), state [B, H, Dk, Dv] or None (zeros) ->
    (o [B, T, H, Dv] in v's dtype, the state after the last token)."""
    dtype = _compute_dtype(q)
    batch, seq, heads, key_dim = q.shape
    if state is None:
        state = q.new_zeros(batch, heads, key_dim, v.shape[-1], dtype=dtype)
    state = state.to(dtype)
    keep = (~starts).to(dtype)
    outputs = []
    for t in range(seq):
        decay = g[:, t].to(dtype).exp() * keep[:, t, None]
        state = state * decay[..., None, None]
        k_t, v_t = k[:, t].to(dtype), v[:, t].to(dtype)
        delta = (v_t - torch.einsum("bhkv,bhk->bhv", state, k_t)) * beta[:, t, :, None].to(dtype)
        state = state + k_t[..., None] * delta[..., None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t].to(dtype)))
    return torch.stack(outputs, 1).to(v.dtype), state


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    starts: torch.Tensor,
    state: torch.Tensor | None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`recurrent_delta_rule` in chunks of `chunk_size` tokens (module docstring); same
    arguments and results."""
    dtype = _compute_dtype(q)
    batch, seq, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    size = chunk_size
    pad = (size - seq % size) % size
    # Padding tokens write nothing (beta 0) and keep the state (g 0): the final state is the last real token's.
    q, k, v = (F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad)).transpose(1, 2) for x in (q, k, v))
    g, beta = (F.pad(x.to(dtype), (0, 0, 0, pad)).transpose(1, 2) for x in (g, beta))
    segment = starts.long().cumsum(1)
    segment = torch.cat([segment, segment[:, -1:].expand(batch, pad)], 1)  # padding joins the last document
    chunks = segment.shape[1] // size
    q, k, v = (x.reshape(batch, heads, chunks, size, -1) for x in (q, k, v))
    g, beta = (x.reshape(batch, heads, chunks, size) for x in (g, beta))
    segment = segment.view(batch, 1, chunks, size)
    before = F.pad(segment[..., -1], (1, 0))[..., :-1]  # document of the token before each chunk
    carried = (segment == before[..., None]).to(dtype)  # [B, 1, N, C]: the token's document began earlier
    same = segment[..., :, None] == segment[..., None, :]
    causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    cum = g.cumsum(-1)
    pair = (cum[..., :, None] - cum[..., None, :]).masked_fill(~(same & causal), float("-inf")).exp()

    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * pair
    pseudo_values = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    state_reads = torch.linalg.solve_triangular(
        system, k_beta * (cum.exp() * carried)[..., None], upper=False, unitriangular=True
    )
    attn = (q @ k.transpose(-1, -2)) * pair
    q_state = q * (cum.exp() * carried)[..., None]
    in_last = (segment == segment[..., -1:]).to(dtype)
    k_state = k * ((cum[..., -1:] - cum).exp() * in_last)[..., None]
    chunk_decay = (cum[..., -1].exp() * carried[..., -1])[..., None, None]

    if state is None:
        state = q.new_zeros(batch, heads, key_dim, value_dim)
    state = state.to(dtype)
    outputs = []
    for n in range(chunks):
        corrected = pseudo_values[:, :, n] - state_reads[:, :, n] @ state
        outputs.append(q_state[:, :, n] @ state + attn[:, :, n] @ corrected)
        state = state * chunk_decay[:, :, n] + k_state[:, :, n].transpose(-1, -2) @ corrected
    out = torch.stack(outputs, 2).reshape(batch, heads, chunks * size, value_dim)[:, :, :seq]
    return out.transpose(1, 2).to(v.dtype), state


def causal_conv(
    x: torch.Tensor, weight: torch.Tensor, starts: torch.Tensor, state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, T, C], weight [C, K], starts [B, T] (True: a document starts; index 0 False: the
    row continues `state`), state [B, C, K - 1] (the inputs before x, zeros where they are
    not of x's first document) -> (silu of the depthwise causal convolution [B, T, C] in x's
    dtype, the new state: the last K - 1 inputs, zeroed where not of the last document)."""
    batch, seq, channels = x.shape
    width = weight.shape[-1]
    dtype = _compute_dtype(x)
    if state is None:
        state = x.new_zeros(batch, channels, width - 1)
    padded = torch.cat([state.to(dtype).transpose(1, 2), x.to(dtype)], 1)  # [B, K - 1 + T, C]
    segment = starts.long().cumsum(1)
    segments = F.pad(segment, (width - 1, 0))  # the state's inputs are of document 0, the row's first
    out = torch.zeros(batch, seq, channels, dtype=dtype, device=x.device)
    w = weight.to(dtype)
    for s in range(width):
        same = (segments[:, s : s + seq] == segment)[..., None].to(dtype)
        out = out + padded[:, s : s + seq] * w[:, s] * same
    tail = padded[:, padded.shape[1] - (width - 1) :]
    in_last = (segments[:, segments.shape[1] - (width - 1) :] == segment[:, -1:])[..., None].to(dtype)
    return F.silu(out).to(x.dtype), (tail * in_last).transpose(1, 2).to(x.dtype)
