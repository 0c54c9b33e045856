"""Document-masked causal attention with interchangeable backends (docs/design.md §3-§4).

One entry point, `attention(q, k, v, document_ids=..., backend=...)`, with shapes

    q        [B, Tq, H,   D]      queries (already rotated)
    k, v     [B, Tk, Hkv, D]      keys/values, Tk >= Tq, H % Hkv == 0 (GQA)
    document_ids [B, Tk] or None  segment id of every key position
    returns  [B, Tq, H, D]

Queries are the *last* Tq key positions (query i sits at key index Tk - Tq + i), which
covers training/prefill (Tq = Tk), chunked prefill and one-token decoding with a KV
cache (Tq = 1) with one convention. Query i may attend key j iff j <= i (causal) and
document_ids[j] == document_ids[i]; with a sliding `window` W > 0 also i - j < W (the query
and the W - 1 keys before it: a sliding layer, transformers' `sliding_window`). Masks come
from `document_ids` and key order only, never from `position_ids`, which
SkipAlign/PoSE/StRing rewrite. Documents must be contiguous runs.

Backends:

- `sdpa`     dense boolean [Tq, Tk] mask into `scaled_dot_product_attention`. The
             reference: any device, O(Tq * Tk) memory.
- `varlen`   pure torch, autograd-capable, the CPU training default; cost and memory
             follow sum_doc |doc|^2 instead of T^2. Training/prefill (Tq = Tk): one
             `is_causal` SDPA call per document of >= SHORT_DOCUMENT tokens (torch's CPU
             flash kernel then skips the masked upper triangle, faster than dense `sdpa`
             even for one document per row; docs/benchmarks.md), shorter documents grouped
             into chunks of <= SHORT_DOCUMENT tokens with a small block-diagonal mask. No
             [T, T] mask is built. Decoding / chunked prefill (Tq < Tk): queries in blocks
             of `block_size`, each attending keys from the start of its first query's
             document to its last query with a small dense mask (none for a block of one
             query: its keys are exactly the allowed ones).
- `flex`     FlexAttention with a document+causal BlockMask built from document
             boundaries (no [Tq, Tk] tensor), compiled once per shape. Decoding
             (Tq <= FLEX_DECODE_QUERIES < Tk) runs `sdpa` instead: its mask is [Tq, Tk], and
             the key length grows every step, which would recompile flex every step.
             torch 2.14 has no FlexAttention backward on CPU: there it serves inference.
- `flash`    variable-length FlashAttention-2 on cu_seqlens (CUDA, fp16/bf16): flash-attn's
             `flash_attn_varlen_func` when installed, else torch's own
             `torch.nn.attention.varlen.varlen_attn` (model/flash.py). The documents of
             all rows are laid end to end; causal = window (-1, 0), bottom-right aligned.
             One query per row (decoding) needs no causal window: the query sees its whole
             document, and a window keeps FA2 off its GQA/split-KV decoding path.
- `xformers` `memory_efficient_attention` with a block-diagonal causal bias (CUDA).
- `auto`     on CUDA: flash when the compute dtype is fp16/bf16 (autocast's dtype under
             autocast) and a varlen kernel exists, else flex; elsewhere varlen.

Attention sinks (`sinks` [H], gpt-oss): every backend but xformers, through the
log-sum-exp its kernel returns (model/sinks.py).

Dtypes: q, k and v must share one dtype (rope.py's dtype rule guarantees it for the model).

The model builds an `AttentionMask` once per forward (`build_mask`) and passes it to every
layer, so the per-batch work (cu_seqlens, BlockMask, document starts) is not repeated
22 times.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from longctx.batch import document_start_index, document_start_mask
from longctx.config.model import ATTENTION_BACKENDS as BACKENDS
from longctx.model import flash
from longctx.model.packed_attention import (
    _flash_attention,
    _flash_cu_seqlens,
    _xformers_attention,
    _xformers_bias,
)
from longctx.model.sinks import dense_with_sinks, flex_with_sinks, sdpa_with_sinks

DEFAULT_BLOCK_SIZE = 256
FLEX_DECODE_QUERIES = 16
"""flex: at most this many queries over a longer key range go to `sdpa` (module docstring)."""
SHORT_DOCUMENT = 256
"""varlen: documents shorter than this share masked calls (one call per document has a
fixed cost on CPU larger than a short document's attention)."""


@dataclass
class AttentionMask:
    """Per-batch masking state shared by all layers of one forward pass."""

    backend: str
    """The resolved backend (never `auto`)."""
    document_ids: torch.Tensor
    """[B, Tk] segment id of every key."""
    q_len: int
    """Number of queries (the last q_len key positions)."""
    window: int = 0
    """W > 0: query i also needs i - j < W (a sliding layer); 0 = every earlier key."""
    extra: Any = None
    """Backend-specific precomputation: document starts, BlockMask, cu_seqlens, bias."""


HALF_DTYPES = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype attention will run in for activations of `dtype`: autocast's dtype when
    autocast is on for the device (q/k/v come out of autocast matmuls), else `dtype`."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """The concrete backend for `backend` on `device`; `dtype` (the compute dtype, None =
    unknown) decides `auto` on CUDA: the flash kernels take only fp16/bf16."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r} is not one of {BACKENDS}")
    if backend != "auto":
        return backend
    if device.type == "cuda":
        half = dtype is None or compute_dtype(dtype, device) in HALF_DTYPES
        return "flash" if half and flash.available() else "flex"
    return "varlen"


def build_mask(
    document_ids: torch.Tensor | None,
    q_len: int,
    backend: str,
    *,
    batch_size: int | None = None,
    kv_len: int | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
    max_seqlen: int | None = None,
    window: int = 0,
) -> AttentionMask:
    """Precompute what `backend` needs to mask a batch. `document_ids` None = one document
    per row; `dtype`: the activations' dtype, which `auto` may depend on (resolve_backend).
    `max_seqlen`: a host-side upper bound on every document's length (the loader's window,
    or the longest document as a collate function counted it); `flash` then reads no
    maximum from the device (else one `.max()` read, a host sync, per batch). `window` W > 0:
    a sliding layer's mask (key j seen by query i only if i - j < W); every backend but
    xformers carries it."""
    if document_ids is None:
        if batch_size is None or kv_len is None:
            raise ValueError("build_mask needs batch_size and kv_len when document_ids is None")
        document_ids = torch.zeros(batch_size, kv_len, dtype=torch.long, device=device)
    if document_ids.dim() != 2:
        raise ValueError(f"document_ids must be [batch, seq], got shape {tuple(document_ids.shape)}")
    kv_len = document_ids.shape[1]
    if not 0 < q_len <= kv_len:
        raise ValueError(f"q_len={q_len} must be in [1, kv_len={kv_len}]")
    backend = resolve_backend(backend, document_ids.device, dtype)
    if backend == "flex" and q_len <= FLEX_DECODE_QUERIES < kv_len:
        backend = "sdpa"
    if window < 0:
        raise ValueError(f"window must be >= 0 (0 = no window), got {window}")
    if window and backend == "xformers":
        raise ValueError("attention backend 'xformers' has no sliding window; use flash, flex, sdpa or varlen")
    if backend == "flash":
        segments = _flash_cu_seqlens(document_ids, q_len, max_seqlen)
        return AttentionMask(backend, document_ids, q_len, window, segments)
    builders: dict[str, Callable[..., Any]] = {
        "sdpa": _dense_mask,
        "varlen": _varlen_plan,
        "flex": _flex_block_mask,
        "xformers": _xformers_bias,
    }
    return AttentionMask(backend, document_ids, q_len, window, builders[backend](document_ids, q_len, window))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    document_ids: torch.Tensor | None = None,
    backend: str = "auto",
    mask: AttentionMask | None = None,
    scale: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal, document-masked attention; see the module docstring for shapes and backends.
    `window` W > 0: a sliding layer (used only when no prebuilt `mask` is given). `sinks`
    [H]: one logit per query head in every softmax's denominator (model/sinks.py)."""
    check_shapes(q, k, v)
    if sinks is not None and (mask.backend if mask is not None else backend) == "xformers":
        raise ValueError("attention backend 'xformers' has no attention sinks; use flash, flex, sdpa or varlen")
    if mask is None:
        mask = build_mask(
            document_ids,
            q.shape[1],
            backend,
            batch_size=q.shape[0],
            kv_len=k.shape[1],
            device=q.device,
            dtype=q.dtype,
            window=window,
        )
    if mask.q_len != q.shape[1] or tuple(mask.document_ids.shape) != (k.shape[0], k.shape[1]):
        raise ValueError(
            f"mask was built for q_len={mask.q_len}, document_ids {tuple(mask.document_ids.shape)} "
            f"but got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    backends: dict[str, Callable[..., torch.Tensor]] = {
        "sdpa": _sdpa_attention,
        "varlen": functools.partial(_varlen_attention, block_size=block_size),
        "flex": _flex_attention,
        "flash": _flash_attention,
        "xformers": _xformers_attention,
    }
    if sinks is None:
        return backends[mask.backend](q, k, v, mask, scale)
    return backends[mask.backend](q, k, v, mask, scale, sinks=sinks)


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4:
        raise ValueError(
            f"expected q [B,Tq,H,D], k/v [B,Tk,Hkv,D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[1] > k.shape[1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch, head_dim or length")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads {q.shape[2]} are not a multiple of key/value heads {k.shape[2]}")


def _allowed(
    doc_q: torch.Tensor, doc_k: torch.Tensor, q_index: torch.Tensor, k_index: torch.Tensor, window: int = 0
) -> torch.Tensor:
    """Boolean [..., Tq, Tk]: same document, key not after query and, with a window W, fewer
    than W keys back."""
    allowed = (doc_q[..., :, None] == doc_k[..., None, :]) & (k_index[None, :] <= q_index[:, None])
    if window:
        allowed &= q_index[:, None] - k_index[None, :] < window
    return allowed


# --- sdpa: dense reference -------------------------------------------------------------


def _dense_mask(document_ids: torch.Tensor, q_len: int, window: int = 0) -> torch.Tensor:
    kv_len = document_ids.shape[1]
    k_index = torch.arange(kv_len, device=document_ids.device)
    q_index = k_index[kv_len - q_len :]
    return _allowed(document_ids[:, kv_len - q_len :], document_ids, q_index, k_index, window)[:, None]


def _sdpa_attention(q, k, v, mask: AttentionMask, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if sinks is not None:
        out = dense_with_sinks(q, k, v, mask.extra, scale, sinks)
    else:
        gqa = q.shape[1] != k.shape[1]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.extra, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)


# --- varlen: pure-torch block-sparse ---------------------------------------------------


@dataclass
class _VarlenPlan:
    chunks: list[list[tuple[int, int, bool]]] | None
    """Tq = Tk: per row, (start, end, needs_mask) chunks that partition the row."""
    starts: list[list[int]] | None
    """Tq < Tk: per row, the key index where each key position's document starts."""


def _varlen_plan(document_ids: torch.Tensor, q_len: int, window: int = 0) -> _VarlenPlan:
    # A sliding layer runs by query blocks: a block's keys start at most W - 1 before its
    # first query, so its cost is T x (block + W) rather than sum |doc|^2.
    if q_len == document_ids.shape[1] and not window:
        return _VarlenPlan(chunks=[_row_chunks(row) for row in document_start_mask(document_ids)], starts=None)
    return _VarlenPlan(chunks=None, starts=document_start_index(document_ids).tolist())


def _row_chunks(is_start: torch.Tensor) -> list[tuple[int, int, bool]]:
    """One row's document-start mask -> long documents alone (causal, no mask); runs of
    short ones grouped (masked)."""
    bounds = [*is_start.nonzero().flatten().tolist(), is_start.shape[0]]
    chunks: list[tuple[int, int, bool]] = []
    group_start = None
    for start, end in itertools.pairwise(bounds):
        if group_start is not None and (end - start >= SHORT_DOCUMENT or end - group_start > SHORT_DOCUMENT):
            chunks.append((group_start, start, True))
            group_start = None
        if end - start >= SHORT_DOCUMENT:
            chunks.append((start, end, False))
        elif group_start is None:
            group_start = start
    if group_start is not None:
        chunks.append((group_start, is_start.shape[0], True))
    return chunks


def _varlen_attention(q, k, v, mask: AttentionMask, scale: float, block_size: int, sinks=None) -> torch.Tensor:
    plan: _VarlenPlan = mask.extra
    if plan.chunks is not None:
        return _varlen_by_document(q, k, v, mask.document_ids, plan.chunks, scale, sinks)
    return _varlen_by_query_block(q, k, v, mask.document_ids, plan.starts, scale, block_size, mask.window, sinks)


def _call(q, k, v, attn_mask, scale: float, sinks, is_causal: bool = False) -> torch.Tensor:
    """One kernel call of the varlen backend on q [Tq, H, D], k/v [Tk, Hkv, D], heads first
    for the kernel (with the sinks: model/sinks.py); returns [Tq, H, D]."""
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    if sinks is not None:
        out = sdpa_with_sinks(q, k, v, sinks, scale=scale, attn_mask=attn_mask, is_causal=is_causal)
    else:
        gqa = q.shape[0] != k.shape[0]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=gqa
        )
    return out.transpose(0, 1)


def _varlen_by_document(q, k, v, document_ids, chunks, scale: float, sinks=None) -> torch.Tensor:
    """Tq = Tk. Chunks partition each row, so split/cat (one copy in backward) replace
    slicing, whose backward writes a full-size zero gradient per slice."""
    rows = []
    for b, (q_row, k_row, v_row) in enumerate(zip(q.unbind(0), k.unbind(0), v.unbind(0), strict=True)):
        sizes = [end - start for start, end, _ in chunks[b]]
        pieces = []
        for (start, end, masked), qc, kc, vc in zip(
            chunks[b], q_row.split(sizes), k_row.split(sizes), v_row.split(sizes), strict=True
        ):
            attn_mask = None
            if masked:
                index = torch.arange(end - start, device=q.device)
                docs = document_ids[b, start:end]
                attn_mask = _allowed(docs, docs, index, index)
            pieces.append(_call(qc, kc, vc, attn_mask, scale, sinks, is_causal=attn_mask is None))
        rows.append(torch.cat(pieces, dim=0))
    return torch.stack(rows, dim=0)


def _varlen_by_query_block(q, k, v, doc, starts, scale: float, block_size: int, window: int = 0, sinks=None):
    batch, q_len = q.shape[:2]
    kv_len = k.shape[1]
    offset = kv_len - q_len
    positions = torch.arange(kv_len, device=q.device)
    rows = []
    for b in range(batch):
        blocks = []
        for q_start in range(0, q_len, block_size):
            q_end = min(q_start + block_size, q_len)
            k_start = starts[b][offset + q_start]
            if window:
                k_start = max(k_start, offset + q_start - window + 1)
            k_end = offset + q_end
            # One query (decoding) attends exactly keys [its document's start or its
            # window's, itself]: no mask, which spares the kernel a masked pass.
            allowed = None
            if q_end - q_start > 1:
                queries, keys = slice(offset + q_start, k_end), slice(k_start, k_end)
                allowed = _allowed(doc[b, queries], doc[b, keys], positions[queries], positions[keys], window)
            blocks.append(_call(q[b, q_start:q_end], k[b, k_start:k_end], v[b, k_start:k_end], allowed, scale, sinks))
        rows.append(torch.cat(blocks, dim=0))
    return torch.stack(rows, dim=0)


# --- flex: FlexAttention BlockMask -----------------------------------------------------


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    # torch.compile specialises per input shape and caches each compilation.
    return torch.compile(flex_attention, dynamic=False)


FLEX_BLOCK = 128
"""FlexAttention's default sparse block (queries and keys)."""


def _flex_block_mask(document_ids: torch.Tensor, q_len: int, window: int = 0):
    """The document+causal BlockMask built from document boundaries, O(T + (T / 128)^2)
    memory. `create_block_mask` would evaluate the mask_mod on a dense [B, 1, Tq, Tk]
    boolean (4 GiB at 64K, 16 GiB at 128K per row).

    Query block [f, l] (key coordinates) sees exactly the keys [start(f), l], start(f) the
    first key of f's document: a key in f's document up to f is seen by f, a later key j <= l
    by query j itself (documents are contiguous runs), nothing else by anyone. So its key
    blocks are start(f) // 128 .. l // 128, none empty. A block is *full* (the kernel skips
    the mask_mod) iff both blocks are whole (T need not divide by 128; create_block_mask pads
    with masked positions), the key block lies inside l's document (first key >= start(l))
    and wholly before the first query (last key <= f). Blocks are listed as
    `create_block_mask` lists them: in ascending key-block order.

    With a window W, start(q) becomes max(start(q), q - W + 1), the first key q sees; it
    still never decreases with q, so the same two rules hold."""
    kv_len = document_ids.shape[1]
    offset = kv_len - q_len
    device = document_ids.device
    q_blocks = -(-q_len // FLEX_BLOCK)
    first = offset + torch.arange(q_blocks, device=device) * FLEX_BLOCK  # [Qb] first query, key coordinates
    last = torch.clamp(first + FLEX_BLOCK, max=kv_len) - 1
    whole = (last - first + 1) == FLEX_BLOCK

    def document_causal(b, h, q_idx, kv_idx):
        query = q_idx + offset
        return (document_ids[b, query] == document_ids[b, kv_idx]) & (kv_idx <= query)

    def document_window(b, h, q_idx, kv_idx):
        return document_causal(b, h, q_idx, kv_idx) & (q_idx + offset - kv_idx < window)

    batch_first, batch_last = (t.expand(document_ids.shape[0], -1) for t in (first, last))
    mask_mod = document_window if window else document_causal
    return flex_block_mask(batch_first, batch_last, whole, first_seen_keys(document_ids, window), q_len, mask_mod)


def first_seen_keys(document_ids: torch.Tensor, window: int) -> torch.Tensor:
    """[B, Tk]: the first key each key position, as a query, sees: its document's start, or
    with a window W max(that, q - W + 1)."""
    starts = document_start_index(document_ids)
    if window:
        starts = torch.maximum(starts, torch.arange(document_ids.shape[1], device=starts.device) - window + 1)
    return starts


def flex_block_mask(
    first: torch.Tensor, last: torch.Tensor, whole: torch.Tensor, starts: torch.Tensor, q_len: int, mask_mod
):
    """The BlockMask of query blocks whose queries lie between key indices `first` and `last`
    [B, Qb] (`whole` [Qb]: the block holds FLEX_BLOCK queries) and see keys [starts[q], q]
    (`first_seen_keys`), by the rules of `_flex_block_mask`'s docstring (also
    sequence_shard's `_flex_shard_mask`)."""
    from torch.nn.attention.flex_attention import BlockMask

    kv_len = starts.shape[1]
    key_first = torch.arange(-(-kv_len // FLEX_BLOCK), device=starts.device) * FLEX_BLOCK  # [Kb]
    key_last = torch.clamp(key_first + FLEX_BLOCK, max=kv_len) - 1
    any_seen = (key_last >= starts.gather(1, first)[..., None]) & (key_first <= last[..., None])
    full_blocks = whole[:, None] & ((key_last - key_first + 1) == FLEX_BLOCK)
    full = full_blocks & (key_first >= starts.gather(1, last)[..., None]) & (key_last <= first[..., None])
    partial = any_seen & ~full

    def ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = blocks[:, None].to(torch.int32)  # [B, 1, Qb, Kb]: one head dimension, broadcast
        order = torch.argsort(blocks, dim=-1, descending=True, stable=True)
        return blocks.sum(-1, dtype=torch.int32), order.to(torch.int32)

    return BlockMask.from_kv_blocks(
        *ordered(partial),
        *ordered(full),
        BLOCK_SIZE=(FLEX_BLOCK, FLEX_BLOCK),
        mask_mod=mask_mod,
        seq_lengths=(q_len, kv_len),
    )


def _flex_attention(q, k, v, mask: AttentionMask, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise RuntimeError(
            "attention backend 'flex' has no backward on CPU in torch 2.14; "
            "train with backend 'varlen' (or run flex under torch.no_grad())"
        )
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if sinks is not None:
        out = flex_with_sinks(q, k, v, mask.extra, scale, sinks, compiled=_compiled_flex_attention())
    else:
        gqa = q.shape[1] != k.shape[1]
        out = _compiled_flex_attention()(q, k, v, block_mask=mask.extra, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)
