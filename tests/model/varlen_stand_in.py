"""Pure-torch stand-ins with the exact signatures of torch's `varlen_attn` (2.14: GQA via
`enable_gqa`; 2.11: no `enable_gqa`), built from their documentation, not from our code:

- q [Nq, Hq, D], k/v [Nk, Hkv, D]; sequence i is q[cu_seq_q[i]:cu_seq_q[i+1]] against
  k/v[cu_seq_k[i]:cu_seq_k[i+1]];
- window_size (left, right), bottom-right aligned: query j of a sequence with sq queries
  and sk keys sees keys [j + sk - sq - left, j + sk - sq + right], -1 = unbounded;
  (-1, 0) is causal;
- return_aux.lse: also the log-sum-exp [Hq, Nq] in fp32 (+inf for a query that sees no
  key, as flash-attn reports it); such queries output 0.

Autograd flows through the output (dense math per sequence), so backward can be checked
too, with the kernels' gradient semantics: the lse comes back detached, as torch's
`varlen.py` registers a backward that drops grad_lse (read in the installed 2.14 and in
pytorch's source without `enable_gqa`), so a caller that differentiates through the lse
gets no gradient from it here either. The stand-ins also check what the real kernels require: one dtype for q/k/v, int32
cu_seqlens, and Python-int max lengths that bound every sequence.
"""

from __future__ import annotations

import math

import torch


def _varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux, scale, window_size, gqa):
    assert query.dtype == key.dtype == value.dtype, (query.dtype, key.dtype, value.dtype)
    assert cu_seq_q.dtype == cu_seq_k.dtype == torch.int32
    assert type(max_q) is int and type(max_k) is int, "max lengths must be host ints (no per-call sync)"
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads:
        assert gqa and heads % kv_heads == 0, f"Hq={heads} Hkv={kv_heads} without enable_gqa"
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    left, right = window_size
    outs, lses = [], []
    for i in range(len(cu_seq_q) - 1):
        qs = query[int(cu_seq_q[i]) : int(cu_seq_q[i + 1])]
        ks, vs = (t[int(cu_seq_k[i]) : int(cu_seq_k[i + 1])] for t in (key, value))
        sq, sk = qs.shape[0], ks.shape[0]
        assert sq <= max_q and sk <= max_k
        ks, vs = ks.repeat_interleave(heads // kv_heads, dim=1), vs.repeat_interleave(heads // kv_heads, dim=1)
        diagonal = torch.arange(sq)[:, None] + sk - sq
        index = torch.arange(sk)[None, :]
        seen = torch.ones(sq, sk, dtype=torch.bool)
        if right >= 0:
            seen &= index <= diagonal + right
        if left >= 0:
            seen &= index >= diagonal - left
        compute = torch.promote_types(qs.dtype, torch.float32)
        scores = torch.einsum("qhd,khd->hqk", qs.to(compute), ks.to(compute)) * scale
        scores = scores.masked_fill(~seen, -math.inf)
        lse = scores.logsumexp(-1)
        weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
        outs.append(torch.einsum("hqk,khd->qhd", weights, vs.to(compute)).to(query.dtype))
        lses.append(lse.masked_fill(~seen.any(-1), math.inf).float())
    out = torch.cat(outs)
    if return_aux is not None and return_aux.lse:
        return out, torch.cat(lses, dim=1).detach()
    return out


def varlen_attn_2_14(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    *,
    return_aux=None,
    scale=None,
    window_size=(-1, -1),
    enable_gqa=False,
    seqused_k=None,
    block_table=None,
    num_splits=None,
):
    assert seqused_k is None and block_table is None
    return _varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux, scale, window_size, enable_gqa)


def varlen_attn_2_11(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
):
    return _varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux, scale, window_size, False)


STAND_INS = {"torch-2.14": varlen_attn_2_14, "torch-2.11": varlen_attn_2_11}


def install(monkeypatch, version: str) -> None:
    """Make backend `flash` run on CPU through the stand-in for torch `version`'s varlen_attn."""
    import sys

    import torch.nn.attention.varlen

    monkeypatch.setitem(sys.modules, "flash_attn", None)  # not installed: torch's kernel is used
    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", STAND_INS[version])
