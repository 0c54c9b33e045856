"""TinyLlama-style decoder (docs/design.md §5): pre-norm RMSNorm, SwiGLU, RoPE, GQA.

The head is untied by default; `model.tie_embeddings` shares one Parameter between the
input embedding and the output head, and `model.attention_bias` adds biases to the
attention projections, as the real checkpoints of DESIGN §14 use (Qwen2: q/k/v).

    model = Llama(ModelConfig.from_preset("tiny"))
    logits = model(input_ids, position_ids=..., document_ids=...)       # [B, T, vocab]

The model reads the batch contract (docs/design.md §3) and nothing else: `position_ids` are the
RoPE indices (reset per document, or rewritten by SkipAlign/PoSE), `document_ids` decide
who attends to whom. Defaults: positions 0..T-1 and one document per row.

Layers differ where the config says so (`ModelConfig.layer_specs`): a sliding layer sees
only its window, with its own RoPE base (Gemma 3, OLMo 3); a NoPE layer rotates nothing
(SmolLM3); a linear layer is Gated DeltaNet (model/gated_deltanet.py). Each forward builds
one `Positions` per layer design (a mask per window, cos/sin per RoPE base), one
`Recurrence` (where documents start) for the linear layers.

Inference keeps keys/values in a `KVCache` (model/kv_cache.py; prefill once, then one
token at a time; sliding layers keep only their window):

    cache = model.new_kv_cache(batch_size=B, max_len=T + new_tokens)
    logits = model(prompt, kv_cache=cache)                 # prefill
    logits = model(next_token[:, None], kv_cache=cache)    # decode, positions continue

Parameter counts of the presets (untied embeddings): tinyllama-1.1b 1.100B, string-1.3b
1.494B (its 128,256-token vocabulary adds 0.39B over TinyLlama), tiny 8.1M, debug 1.2M.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from longctx.config.model import LayerSpec, ModelConfig, RopeScaling
from longctx.model.attention import AttentionMask, attention, build_mask, compute_dtype
from longctx.model.decode import DecodeKeys, DecodeMask, DecodeRotary, DecodeUnrotated, signed_sin
from longctx.model.gate import gated
from longctx.model.gated_deltanet import GatedDeltaNet, Recurrence
from longctx.model.kv_cache import KVCache
from longctx.model.layers import FeedForward, FusedWeights, RMSNorm, joint_weights, linear_into
from longctx.model.loss import chunked_cross_entropy
from longctx.model.positions import Positions, PositionsProvider, check_method_on_layers
from longctx.model.rope import RotaryEmbedding, apply_rotary
from longctx.model.sequence_shard import SequenceShard
from longctx.model.temperature import temperature_factor

__all__ = ["KVCache", "Llama", "RMSNorm"]


@dataclass
class UnrotatedPositions:
    """A NoPE layer: nothing rotates, attention under the layer's mask."""

    mask: AttentionMask

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        return attention(q, k, v, mask=self.mask, sinks=sinks)


@dataclass
class RotaryPositions:
    """Plain RoPE at the batch's position ids, with the document mask: training and
    ordinary inference (the model's own `Positions`)."""

    cos: torch.Tensor
    sin: torch.Tensor
    mask: AttentionMask

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rotary(q, self.cos, self.sin), apply_rotary(k, self.cos, self.sin)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        return attention(q, k, v, mask=self.mask, sinks=sinks)


@dataclass
class TemperedPositions:
    """Another layer's Positions with its queries times a per-position factor [B, Tq, 1, 1]
    after rotating (model/temperature.py); attention as the inner one's."""

    inner: Positions
    factor: torch.Tensor

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = self.inner.rotate(q, k)
        return (q * self.factor).to(q.dtype), k

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.inner.attend(q, k, v, sinks)


class Attention(nn.Module):
    """GQA attention: q/o of n_heads x head_dim, k/v of n_kv_heads x head_dim. qk-norm
    (docs/design.md §5): `head` normalises each head's q and k after the split into heads
    (Qwen3, Gemma 3: q_norm/k_norm of head_dim), `projection` the whole q and k projections
    before it (OLMo 2/3: of n_heads x head_dim and n_kv_heads x head_dim); both before RoPE.
    `query_pre_attn_scalar` s (Gemma) scales q by sqrt(head_dim / s) before RoPE, so every
    backend and position method, dividing by sqrt(head_dim), scores q.k / sqrt(s).
    `attention_gate` multiplies the output by sigmoid(x W_g) before `wo` (model/gate.py)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_size
        qkv_bias = config.attention_bias != "none"
        self.wq = nn.Linear(config.d_model, self.n_heads * self.head_dim, bias=qkv_bias)
        self.wk = nn.Linear(config.d_model, self.n_kv_heads * self.head_dim, bias=qkv_bias)
        self.wv = nn.Linear(config.d_model, self.n_kv_heads * self.head_dim, bias=qkv_bias)
        self.wo = nn.Linear(self.n_heads * self.head_dim, config.d_model, bias=config.attention_bias == "qkvo")
        self.qk_norm = config.qk_norm
        if self.qk_norm != "none":
            whole = self.qk_norm == "projection"
            self.q_norm = RMSNorm(self.head_dim * (self.n_heads if whole else 1), config.norm_eps, config.norm_offset)
            self.k_norm = RMSNorm(
                self.head_dim * (self.n_kv_heads if whole else 1), config.norm_eps, config.norm_offset
            )
        scalar = config.query_pre_attn_scalar
        self.query_scale = (self.head_dim / scalar) ** 0.5 if scalar else 1.0
        self.sinks = nn.Parameter(torch.zeros(self.n_heads)) if config.attention_sinks else None
        """gpt-oss's sink logit per query head (model/sinks.py); None without sinks."""
        gate = {"elementwise": self.n_heads * self.head_dim, "head": self.n_heads}.get(config.attention_gate, 0)
        self.wg = nn.Linear(config.d_model, gate, bias=qkv_bias) if gate else None
        """The output gate's projection (model/gate.py), biased as q is; None without a gate."""
        self.fused: FusedWeights | None = None
        """q, k and v in one buffer (model/layers.py); None until fused."""

    def forward(
        self, x, positions: Positions, layer: int, kv_cache: KVCache | None, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`residual` (see `Block`): residual + the output, added inside the last matmul."""
        batch, seq, _ = x.shape
        x = x.reshape(batch * seq, -1)  # 2-D projections: one matmul each, no reshape of the output
        projections = self.projections()
        joint = joint_weights(self.fused, projections)
        if joint is not None:  # q, k, v (, gate): column blocks (views) of one matmul; q and k rotate as one
            q, k, v, *gate = F.linear(x, *joint).split([p.out_features for p in projections], -1)
        else:
            q, k, v, *gate = (projection(x) for projection in projections)
        if self.qk_norm == "projection":  # in q's dtype: an fp32 weight under autocast would widen it
            q, k = self.q_norm(q).to(q.dtype), self.k_norm(k).to(k.dtype)
        q = q.view(batch, seq, self.n_heads, self.head_dim)
        k = k.view(batch, seq, self.n_kv_heads, self.head_dim)
        v = v.view(batch, seq, self.n_kv_heads, self.head_dim)
        if self.qk_norm == "head":
            q, k = self.q_norm(q).to(q.dtype), self.k_norm(k).to(k.dtype)
        if self.query_scale != 1.0:
            q = q * self.query_scale
        q, k = positions.rotate(q, k)
        if kv_cache is not None:
            k, v = kv_cache.store(layer, k, v)
        out = positions.attend(q, k, v, self.sinks).reshape(batch * seq, -1)
        if gate:
            out = gated(out, gate[0], self.n_heads)
        if residual is not None:
            return linear_into(residual.reshape(batch * seq, -1), out, self.wo).view(batch, seq, -1)
        return self.wo(out).view(batch, seq, -1)

    def projections(self) -> tuple[nn.Linear, ...]:
        """The projections of the attention's input: q, k, v and the gate where there is one."""
        return (self.wq, self.wk, self.wv) if self.wg is None else (self.wq, self.wk, self.wv, self.wg)

    def fuse_(self) -> None:
        self.fused = FusedWeights.fuse_(self.projections())


class Block(nn.Module):
    """x + attn(norm(x)), then the same for the MLP (`norm_placement: pre`); `sandwich`
    also normalises each sublayer's output before the add (Gemma), `post` only that (OLMo 2).
    An absent norm is an Identity: no parameter, so the names are the placement's."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        placement, dim = config.block_norm_placement(layer), config.d_model

        def norm(present: bool) -> nn.Module:
            return RMSNorm(dim, config.norm_eps, config.norm_offset) if present else nn.Identity()

        self.attn_norm, self.attn_post_norm = norm(placement != "post"), norm(placement != "pre")
        self.attn = GatedDeltaNet(config) if config.layer_kinds()[layer] == "linear" else Attention(config)
        self.mlp_norm, self.mlp_post_norm = norm(placement != "post"), norm(placement != "pre")
        self.mlp = FeedForward(config)
        self.pre_only = placement == "pre" and config.attention_bias != "qkvo"

    def forward(self, x, positions: Positions, kv_cache: KVCache | None = None) -> torch.Tensor:
        if self.residual_in_matmul(x):
            x = self.attn(self.attn_norm(x), positions, self.layer, kv_cache, residual=x)
            return self.mlp(self.mlp_norm(x), residual=x)
        x = x + self.attn_post_norm(self.attn(self.attn_norm(x), positions, self.layer, kv_cache))
        return x + self.mlp_post_norm(self.mlp(self.mlp_norm(x)))

    def residual_in_matmul(self, x: torch.Tensor) -> bool:
        """Inference, pre-norms only, no autocast (it would round the residual stream to
        bf16): each residual add joins its sublayer's last matmul (one addmm, rounded once).
        Not when a forward hook watches a sublayer: it sees the sublayer's own output."""
        return (
            self.pre_only
            and not (self.attn._forward_hooks or self.mlp._forward_hooks or nn.modules.module._global_forward_hooks)
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled(x.device.type)
            and x.dtype == self.attn.wo.weight.dtype
        )


class Llama(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps, config.norm_offset)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            # One Parameter under two names: the optimizer, FSDP2 (both modules are in the
            # root's group, train/module.py) and state_dict see a single tensor.
            self.output.weight = self.tok_embeddings.weight
        self.layer_specs = config.layer_specs()
        self.rope = RotaryEmbedding(
            config.head_size,
            config.rope_base,
            config.rope_scaling,
            config.max_position,
            config.rope_position_scale,
            rotary_fraction=config.rotary_fraction,
            partial_rotary=config.partial_rotary,
        )
        """The full layers' RoPE (rope_base, rope_scaling)."""
        self.sliding_rope = RotaryEmbedding(
            config.head_size,
            config.sliding_rope_base or config.rope_base,
            RopeScaling(),
            config.max_position,
            config.rope_position_scale,
            rotary_fraction=config.rotary_fraction,
            partial_rotary=config.partial_rotary,
        )
        """The sliding layers' RoPE: sliding_rope_base, no scaling (transformers' local layers)."""
        self.activation_checkpointing = False
        """Recompute each block's activations in backward: ~1/3 more compute, activation
        memory of one block instead of all (set by the trainer; names stay unchanged)."""
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.config.init_std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.constant_(module.weight, 0.0 if module.offset else 1.0)
            if isinstance(module, Attention) and module.sinks is not None:  # as transformers' gpt-oss
                nn.init.normal_(module.sinks, std=self.config.init_std)

    def fuse_projections_(self) -> Llama:
        """Inference layout: each attention's q/k/v and each MLP's gate/up weights as one
        buffer, so a forward without gradients runs one matmul per group (model/layers.py).
        Call after the last `.to()`; the Parameters, their names and values are unchanged."""
        for module in self.modules():
            if isinstance(module, (Attention, FeedForward)):
                module.fuse_()
        return self

    def new_kv_cache(self, batch_size: int, max_len: int, *, decode_kernel: bool = False) -> KVCache:
        """A cache for `batch_size` rows of up to `max_len` positions; `decode_kernel`: its
        decoding steps' attention in the Triton decoding kernel where it can run
        (model/decode_kernel.py; CUDA), else in torch's kernels."""
        device = self.tok_embeddings.weight.device
        return KVCache(self.config, batch_size, max_len, device=device, decode_kernel=decode_kernel)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        attention_backend: str | None = None,
        position_method: PositionsProvider | None = None,
        last_logits_only: bool = False,
        labels: torch.Tensor | None = None,
        loss_chunk_tokens: int = 0,
        loss_kernel: str = "chunked",
        max_seqlen: int | None = None,
        sequence_shard: SequenceShard | None = None,
    ) -> torch.Tensor:
        """input_ids [B, T] -> logits [B, T, vocab] (fp32 master weights: same dtype as them);
        [B, 1, vocab] with `last_logits_only` (a prefill before decoding needs no more).
        With `labels` [B, T]: instead of logits, the summed next-token cross-entropy over
        labelled tokens, in chunks of `loss_chunk_tokens` tokens (0 = one chunk) that never
        hold [tokens, vocab] fp32 logits at once, each chunk by `loss_kernel` (model/loss.py).

        With a `kv_cache`, input_ids are the next T tokens after the cached ones; missing
        position_ids continue each row from the cache, missing document_ids continue each
        row's last document. `position_method` (StRing, ReRoPE, ...; evaluation only)
        replaces plain RoPE attention; use the same method for the prefill and every
        decoding step of one cache. `max_seqlen`: a host-side bound on every document's
        length, which spares the `flash` backend a device read (attention.build_mask).
        `sequence_shard`: the batch is this rank's tokens of longer rows, whose keys and
        values every layer gathers (context parallelism, model/sequence_shard.py).

        With a `kv_cache` the blocks run eagerly even when compiled (`nn.Module.compile`
        keeps the uncompiled call as `_call_impl`): a prefill's key length changes every
        chunk. A decoding step (one token per row) reads fixed shapes without host syncs
        (model/decode.py); compiling and graph-capturing it is measured on a GPU.
        """
        batch, seq = input_ids.shape
        device = input_ids.device
        backend = attention_backend or self.config.attention_backend
        if self.config.attention_sinks and backend == "xformers":
            raise ValueError("attention backend 'xformers' has no attention sinks; use flash, flex, sdpa or varlen")
        if position_ids is None and kv_cache is not None and seq == 1:
            position_ids = kv_cache.next_position[:, None]
        elif position_ids is None:
            start = kv_cache.next_position[:, None] if kv_cache is not None else 0
            position_ids = start + torch.arange(seq, device=device)[None, :].expand(batch, seq)
        new_documents = document_ids
        if kv_cache is not None:
            kv_cache.fixed_reads = seq == 1 and (
                position_method is None or getattr(position_method, "fixed_shape_decoding", False)
            )
            if document_ids is None:
                document_ids = kv_cache.continued_documents(batch, seq)
        elif document_ids is None:
            document_ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
        for name, tensor in (("position_ids", position_ids), ("document_ids", document_ids)):
            if tensor.shape != input_ids.shape:
                raise ValueError(f"{name} has shape {tuple(tensor.shape)}, input_ids {tuple(input_ids.shape)}")
        decode = None
        if kv_cache is not None:
            key_document_ids, key_position_ids = kv_cache.write_ids(new_documents, document_ids, position_ids)
            if kv_cache.fixed_reads:  # a decoding step (model/decode.py): no host sync, fixed-shape reads
                held = kv_cache.window_span(1)
                decode = DecodeKeys(
                    kv_cache.end, kv_cache.document_start, kv_cache.key_index, held, kv_cache.kernel_buffers
                )
        else:
            key_document_ids, key_position_ids = document_ids, position_ids

        x = self.tok_embeddings(input_ids)
        if self.config.scale_embeddings:  # the factor in fp32, then the embedding dtype (transformers' Gemma)
            x = x * torch.tensor(self.config.d_model**0.5).to(x.dtype)
        dtype = compute_dtype(x.dtype, device)
        layouts = _Layouts(
            self, position_ids, key_position_ids, key_document_ids, seq, backend, dtype, max_seqlen, decode
        )
        if position_method is not None:
            check_method_on_layers(position_method, self.layer_specs, self.config)
        if sequence_shard is not None and (kv_cache is not None or position_method is not None):
            raise ValueError("a sequence shard trains: it takes no kv_cache and no position_method")
        layouts.shard = sequence_shard
        built: dict[LayerSpec, Positions | Recurrence] = {}
        for spec in self.layer_specs:
            if spec.kind == "linear" and spec not in built:  # no positions: where documents start
                built[spec] = Recurrence.of(document_ids, kv_cache, sharded=sequence_shard is not None)
            elif spec not in built:
                built[spec] = layouts.tempered(layouts.positions(spec, position_method, kv_cache), spec)
        for block, spec in zip(self.blocks, self.layer_specs, strict=True):
            positions = built[spec]
            if kv_cache is not None:
                x = block._call_impl(x, positions, kv_cache)
            elif self.activation_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, positions, kv_cache, use_reentrant=False)
            else:
                x = block(x, positions, kv_cache)
        if labels is not None:  # inside forward, so FSDP keeps the head's weight gathered
            hidden = self.norm(x).flatten(0, 1)
            chunk_tokens = loss_chunk_tokens or hidden.shape[0]
            return chunked_cross_entropy(hidden, self.output, labels.flatten(), chunk_tokens, kernel=loss_kernel)
        if last_logits_only:
            x = x[:, -1:]
        logits = self.output(self.norm(x))
        if kv_cache is not None:
            kv_cache.advance(position_ids)
        return logits


@dataclass
class _Layouts:
    """One forward's shared position state: a mask per window, cos/sin per layer kind."""

    model: Llama
    position_ids: torch.Tensor
    key_position_ids: torch.Tensor
    key_document_ids: torch.Tensor
    q_len: int
    backend: str
    dtype: torch.dtype
    max_seqlen: int | None
    decode: DecodeKeys | None = None
    """Set in a decoding step: every layer reads model/decode.py's fixed-shape plan."""
    shard: SequenceShard | None = None
    """Set under context parallelism: every layer gathers keys/values over the shard."""

    def __post_init__(self) -> None:
        self.masks: dict[int, AttentionMask] = {}
        self.decode_masks: dict[int, DecodeMask] = {}
        self.angles: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def positions(self, spec: LayerSpec, method: PositionsProvider | None, kv_cache: KVCache | None) -> Positions:
        """The Positions of layers of design `spec`. A position method runs on the full
        layers that rotate; sliding layers (within the method's exact band: checked) and
        NoPE layers attend as they were trained (docs/design.md §8)."""
        if self.decode is not None:
            return self.decode_positions(spec, method)
        if method is not None and spec.rope and spec.kind == "full":
            return method.prepare(
                self.position_ids,
                self.key_position_ids,
                self.key_document_ids,
                self.q_len,
                backend=self.backend,
                dtype=self.dtype,
            )
        mask = self.mask(spec.window, kv_cache)
        if not spec.rope:
            return self.sharded(UnrotatedPositions(mask))
        if spec.kind not in self.angles:
            rope = self.model.sliding_rope if spec.kind == "sliding" else self.model.rope
            self.angles[spec.kind] = rope(self.position_ids, self.dtype)
        return self.sharded(RotaryPositions(*self.angles[spec.kind], mask))

    def sharded(self, positions: Positions) -> Positions:
        return positions if self.shard is None else self.shard.wrap(positions)

    def decode_positions(self, spec: LayerSpec, method: PositionsProvider | None) -> Positions:
        """`positions` in a decoding step: cos/sin and masks once per step for all layers."""
        assert self.decode is not None
        if method is not None and spec.rope and spec.kind == "full":
            return method.prepare_decode(self.position_ids, self.decode, self.dtype)  # type: ignore[attr-defined]
        if spec.window not in self.decode_masks:
            span = self.decode.held if spec.window else None
            allowed = self.decode.allowed([(0, None)], span)
            self.decode_masks[spec.window] = DecodeMask(allowed, self.dtype, self.decode.kernel)
        mask = self.decode_masks[spec.window]
        if not spec.rope:
            return DecodeUnrotated(mask)
        if spec.kind not in self.angles:
            rope = self.model.sliding_rope if spec.kind == "sliding" else self.model.rope
            cos, sin = rope(self.position_ids, self.dtype)
            self.angles[spec.kind] = cos, signed_sin(sin)
        return DecodeRotary(*self.angles[spec.kind], mask)

    def tempered(self, positions: Positions, spec: LayerSpec) -> Positions:
        """`positions` with the model's attention temperature where it applies to `spec`
        (read from the config at every forward: an evaluation may override it)."""
        config = self.model.config
        if not config.attn_temperature.applies_to(spec.rope):
            return positions
        factor = temperature_factor(
            config.attn_temperature,
            self.position_ids,
            window=spec.window,
            max_position=config.max_position,
            dtype=self.dtype,
        )
        return TemperedPositions(positions, factor)

    def mask(self, window: int, kv_cache: KVCache | None) -> AttentionMask:
        if self.shard is not None:
            return self.shard.mask(window, self.backend)
        if window not in self.masks:
            documents = self.key_document_ids
            if window and kv_cache is not None:  # a sliding layer reads only its kept keys + the new
                documents = documents[:, documents.shape[1] - kv_cache.window_span(self.q_len) :]
            self.masks[window] = build_mask(
                documents, self.q_len, self.backend, dtype=self.dtype, max_seqlen=self.max_seqlen, window=window
            )
        return self.masks[window]
