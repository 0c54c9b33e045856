"""The gated delta rule in flash-linear-attention's Triton kernels (`fla`, the optional extra
`longctx[fla]`; CUDA only): `chunk_gated_delta_rule` over the documents of the batch laid end
to end (`cu_seqlens`), as model/delta_rule.py computes it in torch.

Opt-in: `model.linear_attention.kernel: fla` (an error where it cannot run) or `auto` (fla
where it is installed and the tensors are on CUDA, else torch). The kernel normalises q and
k itself (`use_qk_l2norm_in_kernel`, x / sqrt(sum x^2 + 1e-6), the torch path's), scales q by
Dk^-1/2 and takes g in fp32. Each row's first document starts from the row's cached state
where it continues it; every other document from zeros; a row's final state is its last
document's. The `gpu` test compares it with the torch path on the same inputs.
"""

from __future__ import annotations

import importlib.util

import torch

from longctx.batch import cu_seqlens


def fla_installed() -> bool:
    return importlib.util.find_spec("fla") is not None


def use_fla(kernel: str, x: torch.Tensor) -> bool:
    """Whether `model.linear_attention.kernel` runs the delta rule in fla for input `x`."""
    if kernel == "torch":
        return False
    if kernel == "fla" and not (x.is_cuda and fla_installed()):
        why = "is not installed (pip install 'longctx[fla]')" if x.is_cuda else "runs on CUDA only"
        raise ValueError(f"model.linear_attention.kernel=fla: flash-linear-attention {why}; use torch or auto")
    return x.is_cuda and fla_installed()


def fla_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    starts: torch.Tensor,
    state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """model/delta_rule.py's `chunked_delta_rule` with raw q, k [B, T, Hk, Dk] (fla normalises
    them) and values [B, T, Hv, Dv]; returns (o [B, T, Hv, Dv] in v's dtype, final states)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    batch, seq, n_value, value_dim = v.shape
    groups = n_value // k.shape[2]
    if groups > 1:
        q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
    flat_starts = starts.clone()
    flat_starts[:, 0] = True
    first = flat_starts.flatten().nonzero().flatten()
    lengths = torch.diff(first, append=first.new_full((1,), batch * seq))
    row_of = first // seq
    initial = q.new_zeros(first.shape[0], n_value, k.shape[-1], value_dim, dtype=torch.float32)
    if state is not None:
        row_first = first % seq == 0
        continues = row_first & ~starts.flatten()[first]
        initial[continues] = state.float()[row_of[continues]]
    out, final = chunk_gated_delta_rule(
        q=q.reshape(1, batch * seq, n_value, -1),
        k=k.reshape(1, batch * seq, n_value, -1),
        v=v.reshape(1, batch * seq, n_value, value_dim),
        g=g.float().reshape(1, batch * seq, n_value),
        beta=beta.to(v.dtype).reshape(1, batch * seq, n_value),
        scale=k.shape[-1] ** -0.5,
        initial_state=initial,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu_seqlens(lengths).long(),
    )
    last = torch.cat([row_of[1:] != row_of[:-1], row_of.new_ones(1, dtype=torch.bool)])
    return out.reshape(batch, seq, n_value, value_dim).to(v.dtype), final[last]
