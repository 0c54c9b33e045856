"""One entry point to the variable-length FlashAttention-2 kernel on CUDA.

    out, lse = varlen_flash(q, k, v, cu_q, cu_k, max_q, max_k, scale=s, window=(-1, 0), lse=True)

q [Nq, H, D], k/v [Nk, Hkv, D]: sequences laid end to end, sequence i's queries at
cu_q[i]:cu_q[i+1] and keys at cu_k[i]:cu_k[i+1] (int32). With window (left, right) the
query at index j of a sequence with sq queries and sk keys attends the keys
[j + sk - sq - left, j + sk - sq + right] (bottom-right aligned; -1 = unbounded), so
(-1, 0) is causal and (w, 0) a causal band of w + 1 distances. Returns out [Nq, H, D] and,
with `lse`, the softmax log-sum-exp [H, Nq] in fp32 (what a merge of several passes needs;
a query with no key gets +inf or -inf depending on the kernel: callers mask such rows).

Kernels, first available wins:

- flash-attn's `flash_attn_varlen_func` (the `gpu` extra; needs a source build on most
  images; flash-attn-4's `flash_attn.cute` is not taken for it: benchmarks/fa4_gpu.py
  measures it first);
- torch's own `torch.nn.attention.varlen.varlen_attn` (FlashAttention-2 kernels shipped in
  torch). GQA: `kv_repeats` decides from the wrapper's signature: 2.14's takes fewer k/v
  heads with `enable_gqa` (and refuses them without it); 2.11's has no `enable_gqa`, and
  k/v are expanded to the query heads here (its FA2 kernel may take GQA natively; no GPU
  test of that exists, so the copy stays).

`max_q`/`max_k` are Python ints computed once per batch by the caller (a `.max()` here
would synchronise the host with the GPU on every layer).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

CAUSAL = (-1, 0)
FULL = (-1, -1)


def available() -> bool:
    """True if some varlen flash kernel can be called (CUDA still required to run it)."""
    return _flash_attn() is not None or _torch_varlen() is not None


@dataclass(frozen=True)
class VarlenKernel:
    """The kernel chosen for a batch: resolved once when the batch is planned (outside any
    compiled region), then called by every layer without import or signature lookups."""

    function: Callable[..., Any]
    flash_attn: bool
    """flash-attn's calling convention; else torch's varlen_attn."""
    enable_gqa: bool
    """torch: the kernel takes GQA itself (2.14); else k/v are expanded (2.11)."""


def resolve_kernel() -> VarlenKernel:
    """flash-attn's kernel when installed, else torch's varlen_attn (module docstring)."""
    flash_attn = _flash_attn()
    if flash_attn is not None:
        return VarlenKernel(flash_attn.flash_attn_varlen_func, flash_attn=True, enable_gqa=True)
    varlen = _torch_varlen()
    if varlen is None:
        raise RuntimeError(
            "attention backend 'flash' needs flash-attn or torch.nn.attention.varlen (torch >= 2.10); neither imports"
        )
    parameters = inspect.signature(varlen).parameters
    if "window_size" not in parameters:
        raise RuntimeError(
            f"torch {torch.__version__}'s varlen_attn has no window_size; the flash path needs torch >= 2.11"
        )
    return VarlenKernel(varlen, flash_attn=False, enable_gqa="enable_gqa" in parameters)


def kv_repeats(kernel: VarlenKernel, heads: int, kv_heads: int) -> int:
    """How many copies of each k/v head the kernel must be given: 1 when heads are equal or
    the kernel takes GQA natively (flash-attn; torch's `enable_gqa`), else heads / kv_heads."""
    if heads % kv_heads:
        raise ValueError(f"query heads {heads} are not a multiple of key/value heads {kv_heads}")
    return 1 if kernel.enable_gqa else heads // kv_heads


def varlen_flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    scale: float,
    window: tuple[int, int] = CAUSAL,
    lse: bool = False,
    kernel: VarlenKernel | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """See the module docstring; returns (out, lse or None). `kernel`: from `resolve_kernel`
    at plan time (None = resolve now)."""
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"varlen flash attention needs one dtype for q/k/v, got {q.dtype}, {k.dtype}, {v.dtype}")
    kernel = kernel or resolve_kernel()
    if kernel.flash_attn:
        result = kernel.function(
            q,
            k,
            v,
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            max_seqlen_q=max_q,
            max_seqlen_k=max_k,
            softmax_scale=scale,
            causal=window[1] == 0,
            window_size=window,
            return_attn_probs=lse,
        )
        return (result[0], result[1]) if lse else (result, None)
    options: dict[str, Any] = {"scale": scale, "window_size": window}
    repeats = kv_repeats(kernel, q.shape[1], k.shape[1])
    if repeats > 1:
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    elif k.shape[1] != q.shape[1]:
        options["enable_gqa"] = True
    if lse:
        from torch.nn.attention.varlen import AuxRequest

        out, log_sum_exp = kernel.function(
            q, k, v, cu_q, cu_k, max_q, max_k, return_aux=AuxRequest(lse=True), **options
        )
        return out, log_sum_exp
    return kernel.function(q, k, v, cu_q, cu_k, max_q, max_k, **options), None


def _flash_attn():
    """flash-attn 2's module, or None. flash-attn-4 installs only the namespace package
    `flash_attn.cute` (no top-level `flash_attn_varlen_func`, other arguments): with it alone
    installed, torch's kernel stays the one used."""
    module = sys.modules.get("flash_attn")
    if module is None and "flash_attn" not in sys.modules and importlib.util.find_spec("flash_attn") is not None:
        module = importlib.import_module("flash_attn")
    return module if hasattr(module, "flash_attn_varlen_func") else None


def _torch_varlen():
    """torch's varlen_attn, looked up at call time (tests substitute a CPU stand-in)."""
    try:
        module = importlib.import_module("torch.nn.attention.varlen")
    except ImportError:
        return None
    return getattr(module, "varlen_attn", None)
