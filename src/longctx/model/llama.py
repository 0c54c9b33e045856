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
one `Positions` per distinct layer design, shared by the layers of that design, and one
`Recurrence` (where documents start) for the linear layers: model/layer_attention.py
decides each one's mask and passes.

Inference keeps keys/values in a `KVCache` (model/inference/, the whole path from prompt to
tokens; prefill once, then one token at a time; sliding layers keep only their window):

    cache = model.new_kv_cache(batch_size=B, max_len=T + new_tokens)
    logits = model(prompt, kv_cache=cache)                 # prefill: forward_tokens
    logits = model(next_token[:, None], kv_cache=cache)    # decode_step, positions continue

Parameter counts of the presets (untied embeddings): tinyllama-1.1b 1.100B, string-1.3b
1.494B (its 128,256-token vocabulary adds 0.39B over TinyLlama), tiny 8.1M, debug 1.2M.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from longctx.config.model import LayerSpec, ModelConfig, RopeScaling
from longctx.model.attention import compute_dtype
from longctx.model.gate import gated
from longctx.model.gated_deltanet import GatedDeltaNet, Recurrence
from longctx.model.inference.kv_cache import KVCache
from longctx.model.inference.step import DecodeKeys
from longctx.model.layer_attention import (
    LayerAttention,
    Positions,
    PositionsProvider,
    SequenceKeys,
    check_forward,
    fixed_shape_step,
)
from longctx.model.layers import FeedForward, FusedWeights, RMSNorm, joint_weights, linear_into
from longctx.model.loss import chunked_cross_entropy
from longctx.model.rope import RotaryEmbedding
from longctx.model.sequence_shard import SequenceShard

__all__ = ["KVCache", "Llama", "RMSNorm"]


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
        self.rope = RotaryEmbedding.of_model(config)
        """The full layers' RoPE (rope_base, rope_scaling)."""
        self.sliding_rope = RotaryEmbedding.of_model(
            config, config.sliding_rope_base or config.rope_base, RopeScaling()
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
        (model/inference/kernel.py; CUDA), else in torch's kernels."""
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
        """input_ids [B, T] -> logits [B, T, vocab] (fp32 master weights: their
        dtype), [B, 1, vocab] with `last_logits_only` (a prefill before decoding needs no
        more); with `labels` [B, T] the summed next-token cross-entropy over labelled
        tokens instead, in chunks of `loss_chunk_tokens` tokens (0 = one chunk) by
        `loss_kernel`, never holding [tokens, vocab] fp32 logits at once (model/loss.py).

        With a `kv_cache`, input_ids are the next T tokens after the cached ones; missing
        position_ids continue each row from the cache, missing document_ids each row's
        last document. `position_method` (StRing, ReRoPE, ...; evaluation only) replaces
        plain RoPE on the full layers; one method for a cache's prefill and steps.
        `max_seqlen`: a host bound on every document's length (attention.build_mask).
        `sequence_shard`: the batch is this rank's tokens of longer rows (context
        parallelism, model/sequence_shard.py). Each layer's mask and passes:
        model/layer_attention.py. With a cache the blocks run eagerly even when compiled
        (`_call_impl`): a prefill's key length changes every chunk.

        The entry point of training, prefill and evaluation; a decoding step (one token per
        row over a cache) goes to `decode_step` from here, so that module hooks (FSDP's
        gathers) run for it too."""
        step = kv_cache is not None and labels is None and sequence_shard is None
        if step and fixed_shape_step(input_ids.shape[1], position_method):
            assert kv_cache is not None
            return self.decode_step(input_ids, kv_cache, position_ids, document_ids, position_method, attention_backend)
        backend = attention_backend or self.config.attention_backend
        check_forward(self.config, self.layer_specs, backend, position_method, kv_cache is not None, sequence_shard)
        if kv_cache is not None:
            kv_cache.fixed_reads = False
        position_ids, document_ids, key_positions, key_documents = self._token_ids(
            input_ids, position_ids, document_ids, kv_cache
        )
        x = self.embed(input_ids)
        span = kv_cache.window_span(input_ids.shape[1]) if kv_cache is not None else None
        keys = SequenceKeys(key_positions, key_documents, backend, max_seqlen, span, sequence_shard)
        decided = self.decisions(position_ids, document_ids, keys, x, position_method, kv_cache)
        x = self.run_blocks(x, decided, kv_cache)
        if labels is not None:  # inside forward, so FSDP keeps the head's weight gathered
            hidden = self.norm(x).flatten(0, 1)
            chunk_tokens = loss_chunk_tokens or hidden.shape[0]
            return chunked_cross_entropy(hidden, self.output, labels.flatten(), chunk_tokens, kernel=loss_kernel)
        logits = self.output(self.norm(x[:, -1:] if last_logits_only else x))
        if kv_cache is not None:
            kv_cache.advance(position_ids)
        return logits

    def decode_step(
        self,
        input_ids: torch.Tensor,
        kv_cache: KVCache,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        position_method: PositionsProvider | None = None,
        attention_backend: str | None = None,
    ) -> torch.Tensor:
        """One token per row, input_ids [B, 1], over `kv_cache` -> logits [B, 1, vocab]:
        fixed-shape reads of the whole cache, no host sync (model/inference/step.py), so a
        CUDA graph can replay it (model/inference/graph.py). Positions continue each row
        from the cache and the token its last document, unless given; `position_method`:
        one whose decoding passes are bands (layer_attention.fixed_shape_step)."""
        if not fixed_shape_step(input_ids.shape[1], position_method):
            name = getattr(position_method, "name", None)
            raise ValueError(
                f"decode_step takes one token per row under plain RoPE or a banded method; got input_ids "
                f"{tuple(input_ids.shape)}, position method {name!r}: call the model (forward) instead"
            )
        backend = attention_backend or self.config.attention_backend
        check_forward(self.config, self.layer_specs, backend, position_method, cached=True)
        kv_cache.fixed_reads = True
        if position_ids is None:
            position_ids = kv_cache.next_position[:, None]
        documents = kv_cache.continued_documents(*input_ids.shape) if document_ids is None else document_ids
        _check_ids(input_ids, position_ids, documents)
        kv_cache.write_ids(document_ids, documents, position_ids)
        x = self.embed(input_ids)
        decided = self.decisions(position_ids, documents, kv_cache.step_keys(), x, position_method, kv_cache)
        x = self.run_blocks(x, decided, kv_cache)
        logits = self.output(self.norm(x))
        kv_cache.advance(position_ids)
        return logits

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(input_ids)
        if self.config.scale_embeddings:  # the factor in fp32, then the embedding dtype (transformers' Gemma)
            x = x * torch.tensor(self.config.d_model**0.5).to(x.dtype)
        return x

    def decisions(
        self,
        position_ids: torch.Tensor,
        document_ids: torch.Tensor,
        keys: SequenceKeys | DecodeKeys,
        x: torch.Tensor,
        method: PositionsProvider | None,
        kv_cache: KVCache | None,
    ) -> dict[LayerSpec, Positions | Recurrence]:
        """Every layer design's mask and passes for this forward (model/layer_attention.py);
        the linear layers' document starts from the new tokens' `document_ids` [B, T]."""
        ropes = {"full": self.rope, "sliding": self.sliding_rope}
        dtype = compute_dtype(x.dtype, x.device)
        recurrence = None
        if any(spec.kind == "linear" for spec in self.layer_specs):
            sharded = isinstance(keys, SequenceKeys) and keys.shard is not None
            recurrence = Recurrence.of(document_ids, kv_cache, sharded=sharded)
        decided = LayerAttention(self.config, ropes, position_ids, keys, dtype, method, recurrence)
        return decided.all_layers(self.layer_specs)

    def run_blocks(
        self, x: torch.Tensor, built: dict[LayerSpec, Positions | Recurrence], kv_cache: KVCache | None
    ) -> torch.Tensor:
        for block, spec in zip(self.blocks, self.layer_specs, strict=True):
            positions = built[spec]
            if kv_cache is not None:
                x = block._call_impl(x, positions, kv_cache)
            elif self.activation_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, positions, kv_cache, use_reentrant=False)
            else:
                x = block(x, positions, kv_cache)
        return x

    def _token_ids(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None,
        document_ids: torch.Tensor | None,
        kv_cache: KVCache | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The new tokens' position and document ids (defaults: 0..T-1 and one document,
        or continuing the cache), and every key's, cached ones first, [B, Tk]."""
        batch, seq = input_ids.shape
        if position_ids is None:
            start = kv_cache.next_position[:, None] if kv_cache is not None else 0
            position_ids = start + torch.arange(seq, device=input_ids.device)[None, :].expand(batch, seq)
        documents = document_ids
        if documents is None and kv_cache is not None:
            documents = kv_cache.continued_documents(batch, seq)
        elif documents is None:
            documents = torch.zeros(batch, seq, dtype=torch.long, device=input_ids.device)
        _check_ids(input_ids, position_ids, documents)
        if kv_cache is None:
            return position_ids, documents, position_ids, documents
        key_documents, key_positions = kv_cache.write_ids(document_ids, documents, position_ids)
        return position_ids, documents, key_positions, key_documents


def _check_ids(input_ids: torch.Tensor, position_ids: torch.Tensor, document_ids: torch.Tensor) -> None:
    for name, tensor in (("position_ids", position_ids), ("document_ids", document_ids)):
        if tensor.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, input_ids {tuple(input_ids.shape)}")
