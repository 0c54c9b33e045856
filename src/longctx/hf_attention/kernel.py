"""The attention and mask functions transformers calls for `longctx_<method>`.

Per forward, transformers calls the mask function once per layer type (`create_causal_mask`
for the full layers, `create_sliding_window_causal_mask` for the sliding ones of a hybrid
model) and hands what it returns to every layer of that type. Ours returns a `CompactMask`:
the 2D key validity (None when no key is padding), the query offset in the cache, the
first cache slot the layer's keys start at (`kv_offset`: a sliding cache layer keeps only
its window), the window and the mask's kind, never a [B, 1, Tq, Tk] tensor. The first
layer of each design builds its plan from it and keeps it there for the others
(`ForwardPlan`): one plan per forward for the layers the method runs on (full layers that
rotate) and one masked-attention layout for the layers it leaves as trained (sliding
layers, NoPE layers; docs/design.md §8, as longctx's own model does).

Every layer then calls `attention(module, q, k, v, mask, scaling=, position_ids=,
sliding_window=, ...)` with q [B, H, Tq, D] rotated at the queries' positions and k/v
[B, Hkv, Tk, D] the layer's cache (keys rotated at their own positions; on a sliding layer
slots [kv_offset, kv_offset + Tk)), and gets longctx's own kernels: the PositionMethod's
passes (blockwise pure torch on CPU, the varlen flash passes on CUDA in fp16/bf16), on
relative rotations (methods.py), or longctx's masked attention (with the window) on a layer
the method leaves as trained. gpt-oss hands its sinks as `s_aux` [H]: one logit per query
head in the denominator of every softmax, added once to the union of a method's passes
(out * sigmoid(lse - s_h) with the passes' merged log-sum-exp, PositionMethod.forward), as
if it were one more key of logit s_h and value 0.

Keys, positions and documents (`key_layout`): the queries are the cache slots
[q_offset, q_offset + Tq); slots after them (a StaticCache's empty tail) are cut off. A
cached key's position is the first query's position minus its distance in slots, so the
valid keys of a row must be one run (left padding for generate, right padding for
scoring; padding between tokens is refused). Without a cache the queries' own
position_ids place every key, and a reset (packed sequences) starts a new document.
Padding keys become documents of their own, which no real token attends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from longctx.batch import document_start_index
from longctx.hf_attention.methods import fail, method_for
from longctx.model import flash
from longctx.model.attention import HALF_DTYPES, AttentionMask, build_mask
from longctx.model.attention import attention as longctx_attention
from longctx.model.position_methods import PositionMethod, PositionPlan

REFUSED_KWARGS = {
    "cache": "a paged cache (continuous batching)",
    "cu_seq_lens_q": "packed variable-length inputs (continuous batching, flash-style cu_seq_lens)",
    "read_index": "a paged cache (continuous batching)",
    "block_table": "a paged cache (continuous batching)",
    "softcap": "attention logit soft-capping",
    "sinks": "attention sinks passed as `sinks` (gpt-oss passes them as `s_aux`)",
}
"""Keyword arguments of attention calls that these functions cannot honour."""


@dataclass(eq=False)
class CompactMask:
    """What the mask function hands every layer of one forward (module docstring)."""

    padding: torch.Tensor | None
    """[B, N] bool key validity (True: a token, False: padding), N >= the keys; None: no padding."""
    q_offset: int
    """Cache slot of the first query."""
    q_length: int
    kv_offset: int
    kind: str
    """The mask function transformers asked for: 'causal', 'and' (packed or sliding), 'other'."""
    window: int | None = None
    """The sliding window of a `create_sliding_window_causal_mask` mask (its `local_size`)."""
    plans: dict[tuple[str, str], ForwardPlan] = field(default_factory=dict)
    """The forward's plans by (method, 'method' | 'trained'), each built by its first layer."""
    ndim = 4
    """transformers reads `ndim` of a mask it is handed back (generate with a StaticCache)."""

    def contiguous(self) -> CompactMask:
        return self


def mask_function(name: str):
    """The AttentionMaskInterface function of longctx_<name>: a CompactMask per forward."""

    def compact_mask(
        batch_size: int,
        q_length: int,
        kv_length: int,
        q_offset: Any = 0,
        kv_offset: Any = 0,
        mask_function: Any = None,
        attention_mask: Any = None,
        **kwargs: Any,
    ) -> CompactMask:
        from transformers.masking_utils import causal_mask_function

        if isinstance(attention_mask, CompactMask):  # generate's StaticCache path hands it back
            attention_mask = attention_mask.padding
        padding = None
        if attention_mask is not None:
            if attention_mask.dim() != 2:
                raise fail(name, f"a {attention_mask.dim()}D attention mask is not supported; pass the 2D padding mask")
            padding = attention_mask.to(torch.bool)
            if bool(padding.all()):
                padding = None
        kind = "other"
        if mask_function is None or mask_function is causal_mask_function:
            kind = "causal"
        elif getattr(mask_function, "__qualname__", "").startswith("and_masks"):
            kind = "and"
        window = kwargs.get("local_size")
        return CompactMask(
            padding, int(q_offset), q_length, int(kv_offset), kind, None if window is None else int(window)
        )

    compact_mask.__name__ = compact_mask.__qualname__ = f"longctx_{name}_mask"
    return compact_mask


@dataclass
class ForwardPlan:
    """One forward's keys and plan, shared by the layers of one design."""

    end: int
    """Keys used: the first `end` keys the layer is handed."""
    plan: PositionPlan | None
    """The method's plan (the layers it runs on), None on a layer left as trained."""
    mask: AttentionMask | None = None
    """The masked-attention layout of a layer left as trained."""


def backend_for(device: torch.device, dtype: torch.dtype) -> str:
    """The varlen flash passes on CUDA in fp16/bf16, longctx's pure-torch kernels elsewhere."""
    if device.type == "cuda" and dtype in HALF_DTYPES and flash.available():
        return "flash"
    return "varlen"


def key_layout(
    mask: CompactMask, position_ids: torch.Tensor | None, batch: int, q_len: int, device: torch.device, method: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids, document_ids) [B, end] of every key (module docstring)."""
    end = mask.q_offset + q_len
    if position_ids is None:
        query_positions = torch.arange(mask.q_offset, end, device=device).expand(batch, -1)
    else:
        query_positions = position_ids.to(device=device, dtype=torch.long).expand(batch, -1)
    if mask.padding is None:
        valid = torch.ones(batch, end, dtype=torch.bool, device=device)
    else:
        valid = mask.padding[:, :end].to(device)
        if valid.shape[1] < end:  # a mask shorter than the keys: the rest are tokens
            valid = torch.nn.functional.pad(valid, (0, end - valid.shape[1]), value=True)
    cached = query_positions[:, :1] - torch.arange(mask.q_offset, 0, -1, device=device)
    positions = torch.cat([cached, query_positions], dim=1)
    seen_token = valid.cummax(dim=1).values
    hole = ~valid & seen_token
    after_hole = torch.nn.functional.pad(hole.cummax(dim=1).values[:, :-1], (1, 0), value=False)
    if bool((valid & after_hole).any()):
        raise fail(method, "padding between the tokens of a row is not supported (pad on the left or on the right)")
    if bool((valid & (positions < 0)).any()):
        raise fail(method, "position_ids do not continue the cached keys (a key would sit at a negative position)")
    steps = positions[:, 1:] == positions[:, :-1] + 1
    boundary = (valid[:, 1:] != valid[:, :-1]) | (valid[:, 1:] & ~steps)
    documents = torch.nn.functional.pad(boundary.long().cumsum(dim=1), (1, 0))
    index = torch.arange(end, device=device).expand(batch, -1)
    positions = torch.where(valid, positions, index - document_start_index(documents))
    return positions, documents


def refuse_custom_mask(name: str, mask: CompactMask, documents: torch.Tensor, window: int | None) -> None:
    """Refuse a mask function other than causal, packed sequences and (with a `window`) sliding."""
    packed = mask.q_offset == 0 and bool((documents[:, -1] > 0).any()) and mask.padding is None
    if mask.kind == "other" or (mask.kind == "and" and not packed and window is None):
        raise fail(name, "a custom mask function (or/and masks, block overlays) is not supported")


def forward_plan(
    method: PositionMethod,
    name: str,
    mask: CompactMask,
    query: torch.Tensor,
    key: torch.Tensor,
    position_ids: torch.Tensor | None,
    sliding_window: int | None,
) -> ForwardPlan:
    batch, _, q_len, _ = query.shape
    if mask.kv_offset:
        raise fail(name, f"a cache that drops keys (kv_offset={mask.kv_offset}) is not supported")
    end = mask.q_offset + q_len
    if key.shape[2] < end:
        raise fail(name, f"the cache holds {key.shape[2]} keys, the queries end at slot {end}")
    if sliding_window is not None and end > sliding_window:
        raise fail(name, f"{end} keys exceed the sliding window of {sliding_window}; full attention only")
    positions, documents = key_layout(mask, position_ids, batch, q_len, query.device, name)
    refuse_custom_mask(name, mask, documents, sliding_window)
    plan = method.plan(
        positions,
        documents,
        q_len,
        keys_rotated=method.caches_rotated_keys,
        backend=backend_for(query.device, query.dtype),
        dtype=query.dtype,
    )
    return ForwardPlan(end, plan)


def trained_plan(
    name: str,
    mask: CompactMask,
    query: torch.Tensor,
    key: torch.Tensor,
    position_ids: torch.Tensor | None,
    sliding_window: int | None,
) -> ForwardPlan:
    """The layout of a layer the method leaves as trained: causal, document-masked attention
    over the keys it is handed (cache slots [kv_offset, q_offset + Tq)), within the window
    on a sliding layer (key j seen by query i iff i - j < W, transformers' convention)."""
    batch, _, q_len, _ = query.shape
    end = mask.q_offset + q_len
    used = end - mask.kv_offset
    if mask.kv_offset < 0 or key.shape[2] < used:
        raise fail(
            name, f"the layer holds {key.shape[2]} keys from slot {mask.kv_offset}, the queries end at slot {end}"
        )
    if mask.window is not None and mask.window != sliding_window:
        raise fail(name, f"a sliding mask of window {mask.window} handed to a layer of window {sliding_window}")
    if mask.kv_offset and sliding_window is None:
        raise fail(name, f"a full layer's cache that drops keys (kv_offset={mask.kv_offset}) is not supported")
    _, documents = key_layout(mask, position_ids, batch, q_len, query.device, name)
    refuse_custom_mask(name, mask, documents, mask.window)
    layout = build_mask(
        documents[:, mask.kv_offset :],
        q_len,
        backend_for(query.device, query.dtype),
        dtype=query.dtype,
        window=sliding_window or 0,
    )
    return ForwardPlan(used, None, layout)


def trained_as_is(module: torch.nn.Module, sliding_window: int | None) -> bool:
    """A layer the methods leave as trained: a sliding layer of a hybrid model (its type in
    `layer_types`) or a NoPE layer (`use_rope` false: SmolLM3). A model whose every layer
    passes a window (Mistral) runs the method on them within the window (forward_plan)."""
    if not getattr(module, "use_rope", True):
        return True
    types = getattr(module.config, "layer_types", None)
    index = getattr(module, "layer_idx", None)
    return (
        sliding_window is not None and types is not None and index is not None and types[index] == "sliding_attention"
    )


def attention_function(name: str):
    """The AttentionInterface function of longctx_<name>."""

    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Any,
        dropout: float = 0.0,
        scaling: float | None = None,
        position_ids: torch.Tensor | None = None,
        sliding_window: int | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        for keyword, what in REFUSED_KWARGS.items():
            if kwargs.get(keyword) is not None:
                raise fail(name, f"{what} is not supported")
        if dropout:
            raise fail(name, f"attention dropout ({dropout}) is not supported")
        if not isinstance(attention_mask, CompactMask):
            got = "no mask" if attention_mask is None else f"a {type(attention_mask).__name__} mask"
            raise fail(
                name,
                f"got {got}, not longctx's: the model did not build its mask with transformers' "
                "create_causal_mask (a family whose attention does not follow the standard call), or was given a 4D mask",
            )
        method = method_for(module.config, name)
        sinks = kwargs.get("s_aux")
        trained = trained_as_is(module, sliding_window)
        if trained and sliding_window is not None and sliding_window > method.exact_below:
            raise fail(
                name, f"the method changes distances below {method.exact_below}; the window {sliding_window} sees them"
            )
        plan_key = (name, "trained" if trained else "method")
        state = attention_mask.plans.get(plan_key)
        if state is None:
            if trained:
                state = trained_plan(name, attention_mask, query, key, position_ids, sliding_window)
            else:
                state = forward_plan(method, name, attention_mask, query, key, position_ids, sliding_window)
            attention_mask.plans[plan_key] = state
        q = query.transpose(1, 2)
        k = key[:, :, : state.end].transpose(1, 2)
        v = value[:, :, : state.end].transpose(1, 2)
        scale = q.shape[-1] ** -0.5 if scaling is None else scaling
        if state.plan is None:  # a layer left as trained: plain masked attention, sinks included
            return longctx_attention(q, k, v, mask=state.mask, scale=scale, sinks=sinks), None
        if state.plan.mask is not None and method.rotation_free:  # one pass at own positions (rope): no rotation
            return longctx_attention(
                q, k, v, mask=state.plan.mask, scale=scale * method.score_multiplier, sinks=sinks
            ), None
        return method(q, k, v, state.plan, scale=scaling, sinks=sinks), None

    attention.__name__ = attention.__qualname__ = f"longctx_{name}_attention"
    return attention
