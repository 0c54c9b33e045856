"""A decoding step's attention as one Triton kernel: every pass, their union softmax, GQA, split keys.

A cached decoding step attends one new query per row over the cache. A position method
with several passes (StRing: the diagonal band with the query at its own position, the
shifted band with the query moved; docs/design.md §4) gives each row P rotated queries,
pass p seeing only the keys of its band. The row's attention is ONE softmax over the union
of the passes' (query, key) scores (STRING Algorithm 2 gets it by merging each pass's
softmax by log-sum-exp). Eager, that is the kernel's call plus a merge of four operations
per layer; this kernel computes the union directly, in one launch per layer whatever P
is, so StRing's step dispatches as many operations as RoPE's:

- grid (B x Hkv, splits): a program takes one key/value head's G = H / Hkv query heads
  (GQA read natively: each key is loaded once for its whole query group) and one slice of
  the keys. Splitting the keys is what lets a batch-1 step over a 32K cache fill the GPU
  (4 key/value heads alone would be 4 programs);
- within a slice, blocks of BLOCK_N keys; for each pass p, scores s = q_p . k * scale,
  -inf where `allowed[b, p, key]` is false, folded into one online softmax (running max
  m, sum l, unnormalised output acc) over the pairs (p, key): exactly the softmax over the
  union, bands overlapping or not;
- the slices' (m, l, acc) go to a workspace; the program that finishes last for its head
  (an acquire/release counter, reset by that program, so a CUDA graph replays it) merges
  them: M = max m_s, out = sum acc_s e^(m_s - M) / sum l_s e^(m_s - M). One launch, no
  host sync, fixed shapes: the step stays capturable (model/inference/graph.py).

Scores, softmax and the accumulator are fp32; the weights are rounded to v's dtype for the
second product (as FlashAttention does). A row that sees no key gets zeros. fp32 inputs
use IEEE products (not TF32). Used on CUDA for fp16/bf16/fp32 without attention sinks
(model/inference/step.py); on CPU the fused CPU kernel and the merge run, and the tests run this
kernel through Triton's interpreter (TRITON_INTERPRET=1) against them. It runs only
for a KV cache that carries `KernelBuffers` (`eval.cuda_decoding` kernel | graph+kernel:
model/inference/generation.py); its workspaces and output are that cache's.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import torch

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_N = 64
"""Keys per block: 64 keys x head_dim 64 x 2 bytes is 8 KB per load of k and of v."""
TARGET_PROGRAMS = 264
"""Programs per launch worth having: two per SM of an H100 (132 SMs)."""
MIN_KEYS_PER_SPLIT = 256
"""Below this a slice's fixed cost (queries, workspace, merge) outweighs its keys."""
MAX_SPLITS = 128


def interpreted() -> bool:
    """Triton's CPU interpreter is on (the tests' way to run the kernel without a GPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _triton() -> Any:
    try:
        import triton
    except ImportError:
        return None
    return triton


def usable(queries: torch.Tensor) -> bool:
    """The kernel runs for these queries: CUDA (or the interpreter), Triton importable, a
    dtype it takes. fp64 (the references) keeps the eager path."""
    if queries.dtype not in KERNEL_DTYPES:
        return False
    if queries.device.type != "cuda" and not interpreted():
        return False
    return _triton() is not None


def splits_for(rows: int, keys: int) -> int:
    """Key slices per (row, key/value head): enough programs to fill the GPU, at least
    MIN_KEYS_PER_SPLIT keys each. Host ints only (shapes), so a step's launch is fixed."""
    wanted = math.ceil(TARGET_PROGRAMS / rows)
    most = max(1, keys // MIN_KEYS_PER_SPLIT)
    return max(1, min(wanted, most, MAX_SPLITS))


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << (n - 1).bit_length())


class KernelBuffers:
    """The kernel's workspaces and output for one owner: the KV cache of one generation
    (model/inference/kv_cache.py `KVCache.kernel_buffers`; a cache without them decodes with torch's
    kernels), each allocated once per (shape, dtype, device, stream).

    Why buffers at all: a step recorded as a CUDA graph reads the same buffers at every
    replay, and an eager step allocates nothing. The output is one buffer for every layer
    of a step, safe only because each layer's output projection reads it before the next
    layer's attention writes it, in order on one stream. Why per owner and stream: work
    that is not ordered with it, another model's steps on another stream, or this cache's
    steps on a graph's capture stream beside its eager ones, would overwrite an output
    that is yet to be read; each (owner, stream) gets its own. The arrival counters
    (`zero`) are back to zero after every launch (the merging program resets its own). The
    buffers live as long as the owner, so a graph that reads them lives no longer than its
    cache, and nothing is held after a generation ends."""

    def __init__(self) -> None:
        self.workspaces: dict[tuple, torch.Tensor] = {}
        self.outputs: dict[tuple, torch.Tensor] = {}

    def output(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return _buffer(self.outputs, shape, dtype, device)

    def workspace(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, zero: bool = False
    ) -> torch.Tensor:
        return _buffer(self.workspaces, shape, dtype, device, zero)


def stream_key(device: torch.device) -> int | None:
    """The current stream of `device` as a buffer key (None off CUDA: one stream)."""
    return torch.cuda.current_stream(device).stream_id if device.type == "cuda" else None


def _buffer(
    cache: dict[tuple, torch.Tensor],
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    zero: bool = False,
) -> torch.Tensor:
    key = (shape, dtype, device, stream_key(device))
    if key not in cache:
        cache[key] = (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)
    return cache[key]


def decode_attend(
    queries: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    buffers: KernelBuffers,
) -> torch.Tensor:
    """queries [B, P, H, D] (pass p's rotated query), k/v [B, Tk, Hkv, D] (any strides,
    the last dimension contiguous), allowed [B, P, Tk] boolean -> [B, 1, H, D] in the
    queries' dtype, written into `buffers`' output: the softmax over the union of the
    passes (module docstring)."""
    batch, passes, heads, dim = queries.shape
    keys, kv_heads = k.shape[1], k.shape[2]
    if allowed.shape != (batch, passes, keys) or v.shape != k.shape or heads % kv_heads:
        raise ValueError(
            f"decode_attend: queries {tuple(queries.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"allowed {tuple(allowed.shape)}: want [B, P, H, D], [B, Tk, Hkv, D] twice, [B, P, Tk]"
        )
    if queries.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("decode_attend: the head dimension must be contiguous in queries, k and v")
    out = buffers.output((batch, 1, heads, dim), queries.dtype, queries.device)
    launch(queries, k, v, allowed.view(torch.uint8), out, scale, buffers)
    return out


def launch(
    queries: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seen: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    buffers: KernelBuffers,
) -> None:
    """One launch of the kernel writing `out` (seen: `allowed` as uint8). Everything it
    reads besides its arguments is in `buffers`, allocated once per shape."""
    batch, passes, heads, dim = queries.shape
    keys, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    block_g, block_d = _pow2(group), _pow2(dim)
    programs = batch * kv_heads
    splits = splits_for(programs, keys)
    per_split = math.ceil(math.ceil(keys / splits) / BLOCK_N) * BLOCK_N
    splits = math.ceil(keys / per_split)
    device, interpreter = queries.device, interpreted()
    acc = buffers.workspace((programs, splits, block_g, block_d), torch.float32, device)
    ml = buffers.workspace((programs, splits, 2, block_g), torch.float32, device)
    counters = buffers.workspace((programs,), torch.int32, device, zero=True)
    _kernel()[(programs, splits)](
        queries, k, v, seen, out, acc, ml, counters,
        scale, keys, per_split, splits,
        queries.stride(0), queries.stride(1), queries.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        seen.stride(0), seen.stride(1), seen.stride(2),
        out.stride(0), out.stride(2),
        KV_HEADS=kv_heads, GROUP=group, PASSES=passes, DIM=dim,
        BLOCK_G=block_g, BLOCK_D=block_d, BLOCK_N=BLOCK_N,
        PRECISION="ieee" if queries.dtype == torch.float32 or interpreter else "tf32",
        # the interpreter's products mistake bf16 for integers: it multiplies the values, widened
        UPCAST=interpreter and queries.dtype == torch.bfloat16,
    )  # fmt: skip


@functools.cache
def _kernel() -> Any:
    """The kernel, defined on first use (Triton reads TRITON_INTERPRET when it decorates)."""
    triton = _triton()
    import triton.language as tl

    @triton.jit
    def decode_union_kernel(
        Q, K, V, A, OUT, ACC, ML, COUNT,
        scale, keys, per_split, splits,
        sqb, sqp, sqh, skb, skt, skh, svb, svt, svh, sab, sap, san, sob, soh,
        KV_HEADS: tl.constexpr, GROUP: tl.constexpr, PASSES: tl.constexpr, DIM: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
        UPCAST: tl.constexpr,
    ):  # fmt: skip
        program = tl.program_id(0)
        split = tl.program_id(1)
        row = program // KV_HEADS
        kv_head = program % KV_HEADS
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        qd_ok = (g < GROUP)[:, None] & (d < DIM)[None, :]
        q_at = Q + row * sqb + (kv_head * GROUP + g)[:, None] * sqh + d[None, :]
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        start = split * per_split
        stop = tl.minimum(start + per_split, keys)
        for first in range(start, stop, BLOCK_N):
            n = first + tl.arange(0, BLOCK_N)
            n_ok = n < stop
            kv_ok = n_ok[:, None] & (d < DIM)[None, :]
            k = tl.load(K + row * skb + n[:, None] * skt + kv_head * skh + d[None, :], mask=kv_ok, other=0.0)
            v = tl.load(V + row * svb + n[:, None] * svt + kv_head * svh + d[None, :], mask=kv_ok, other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
            for p in tl.static_range(PASSES):
                q = tl.load(q_at + p * sqp, mask=qd_ok, other=0.0)
                if UPCAST:
                    q = q.to(tl.float32)
                scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
                seen = tl.load(A + row * sab + p * sap + n * san, mask=n_ok, other=0) != 0
                scores = tl.where(seen[None, :], scores, float("-inf"))
                grown = tl.maximum(m, tl.max(scores, 1))
                # a row that has seen nothing yet keeps m = -inf: subtract 0 instead (e^-inf = 0)
                base = tl.where(grown == float("-inf"), 0.0, grown)
                weights = tl.exp(scores - base[:, None])
                shrink = tl.exp(m - base)
                total = total * shrink + tl.sum(weights, 1)
                weights = weights.to(v.dtype)
                if UPCAST:
                    acc = acc * shrink[:, None] + tl.dot(
                        weights.to(tl.float32), v.to(tl.float32), input_precision=PRECISION
                    )
                else:
                    acc = acc * shrink[:, None] + tl.dot(weights, v, input_precision=PRECISION)
                m = grown
        slot = program * splits + split
        tl.store(ACC + (slot * BLOCK_G + g[:, None]) * BLOCK_D + d[None, :], acc)
        tl.store(ML + slot * 2 * BLOCK_G + g, m)
        tl.store(ML + slot * 2 * BLOCK_G + BLOCK_G + g, total)
        # every thread's stores are issued before the release; the last program to arrive
        # acquires them all and merges (the classic threadfence reduction)
        tl.debug_barrier()
        arrived = tl.atomic_add(COUNT + program, 1, sem="acq_rel", scope="gpu")
        if arrived == splits - 1:
            tl.debug_barrier()
            m_all = tl.full([BLOCK_G], float("-inf"), tl.float32)
            total_all = tl.zeros([BLOCK_G], tl.float32)
            acc_all = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
            for part in range(0, splits):
                at = program * splits + part
                m_part = tl.load(ML + at * 2 * BLOCK_G + g, cache_modifier=".cg")
                total_part = tl.load(ML + at * 2 * BLOCK_G + BLOCK_G + g, cache_modifier=".cg")
                acc_part = tl.load(ACC + (at * BLOCK_G + g[:, None]) * BLOCK_D + d[None, :], cache_modifier=".cg")
                grown = tl.maximum(m_all, m_part)
                base = tl.where(grown == float("-inf"), 0.0, grown)
                old, new = tl.exp(m_all - base), tl.exp(m_part - base)
                total_all = total_all * old + total_part * new
                acc_all = acc_all * old[:, None] + acc_part * new[:, None]
                m_all = grown
            result = acc_all / tl.where(total_all == 0.0, 1.0, total_all)[:, None]
            o_at = OUT + row * sob + (kv_head * GROUP + g)[:, None] * soh + d[None, :]
            tl.store(o_at, result.to(OUT.dtype.element_ty), mask=qd_ok)
            tl.atomic_xchg(COUNT + program, 0, sem="relaxed", scope="gpu")

    return decode_union_kernel
