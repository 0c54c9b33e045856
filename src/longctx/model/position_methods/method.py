"""Evaluation-time position methods: StRing and the training-free baselines (docs/design.md §8).

Every method here rewrites the relative position P[m][n] = m - n that RoPE sees between a
query at position m and a key at position n (positions within a document), without
training. Each is a list of passes (plan.py: a pass covers a range of key
distances per query and rotates queries and keys at its own RoPE indices; the passes'
softmaxes are merged with their fp32 log-sum-exps, STRING Algorithm 2).

Methods (L = training length = model.max_position; pass = [nearest, farthest] distances):

- `rope`     plain RoPE, one pass [0, inf); `repo_score_scale` multiplies its scores by
             (1 + 0.1 ln 2)^2 like compat='repo' StRing (the temperature without the shift).
- `ntk`      NTK-aware scaling (LocalLLaMA, 2023): base' = base * a^(d / (d - 2)).
- `yarn`     YaRN (Peng et al., 2023): per-dimension interpolation ramp between
             beta_fast and beta_slow rotations, cos/sin times 0.1 ln(a) + 1 (rope.py).
- `string`   StRing (An et al., 2024, §4.1 Eq. 4), shift S, local window W < S:
             P'[m][n] = P[m][n] - S + W if P[m][n] >= S else P[m][n].
             Pass "diagonal" [0, S-1]: queries at m. Pass "shifted" [S, inf): queries at
             m - S + W. Keys keep their positions in both, so a KV cache of rotated keys
             serves it unchanged. compat='repo' reproduces the authors' released
             string_for_llama.py instead: its first pass is flash-attn's window (S, 0),
             i.e. [0, S], so the diagonal m - n = S is attended twice (at S and at W), and
             its cos/sin are multiplied by 1 + 0.1 ln 2 for queries and keys alike, i.e.
             scores by (1 + 0.1 ln 2)^2 ~ 1.14. Its one-token decoding path (q_len == 1
             with a KV cache) attends the last S keys, the band [0, S-1], and so does
             ours: a single-query forward takes `decode_passes` (diagonal [0, S-1],
             shifted band and temperature unchanged), a multi-query forward (prefill,
             chunked prefill included) the [0, S] diagonal. Under compat='repo' a cached
             decoding step therefore differs from re-running the prompt, as the authors'
             code does (replaying the prompt instead moves SmolLM2-135M's logits by up to 0.26).
- `rerope`   ReRoPE (Su, 2023): P' = min(P, w). Pass [0, w-1] at (m, n); pass [w, inf)
             with queries at w and keys at 0 (unrotated). As in Su's released patch, queries
             at position m are multiplied by max(1, log(m + 1) / log(L_log)) (log-n scaling).
- `self_extend` Self-Extend (Jin et al., 2024, §3): neighbour window w_n, group size G.
             P' = P if P < w_n else floor(m/G) - floor(n/G) + w_n - floor(w_n/G):
             pass [0, w_n-1] at (m, n); pass [w_n, inf) at (floor(m/G) + w_n - floor(w_n/G),
             floor(n/G)). The released code shifts by w_n - w_n/G (a float), the same when G
             divides w_n, as the protocol preset makes it.
- `dca`      Dual Chunk Attention (An et al., 2024, §3.1), chunk size s, local window w,
             c = s + w: keys at n mod s; same chunk (intra) queries at m mod s; the next
             chunk (successive) queries at s + (m mod s) if (m mod s) < w else c - 1; any
             earlier chunk (inter) queries at c - 1. Relative positions never exceed c - 1.
- `dpe`      DPE (Lu et al., 2025): Self-Extend per group g of RoPE's frequency pairs, window
             W, scale s_g: pass [0, W-1] at (m, n); pass [W, inf) with pair i of group g at
             (floor(m/s_g) + W - W/s_g, floor(n/s_g)), one position per pair (plan.PositionMap).

The paper's baseline protocol (STRING §4.2: pretend the training length is L' = 2/3 L and
extrapolate by L / L' = 1.5) is `baseline_protocol(name, L)`; config fields left at 0
take its values.

Kernels: pure torch on any device (cpu.py, the CPU default) and the varlen FlashAttention
kernel on CUDA (gpu.py, attention backend `flash`): string, rerope and self_extend as
fixed distance bands, dca as whole-chunk segments; rope/ntk/yarn call `attention()` with
the chosen backend.

KV cache contract: methods with `caches_rotated_keys` (rope, ntk, yarn, string) rotate
every key once at its own position with `rotate_keys` (the method's own RoPE: ntk/yarn
differ from the model's) and attend with `keys_rotated=True`; rerope, self_extend and dca
rotate keys at rewritten positions (0, floor(n/G), n mod s), so their cache keeps
*un-rotated* keys and every step rotates the keys it reads (Self-Extend and DCA: all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.model.attention import DEFAULT_BLOCK_SIZE, attention, build_mask, resolve_backend
from longctx.model.inference.step import DecodeKeys, DecodeMask, Step, signed_sin
from longctx.model.position_methods.cpu import TorchLayout, block_spans, torch_layout, torch_passes
from longctx.model.position_methods.gpu import VarlenLayout, varlen_layout, varlen_passes
from longctx.model.position_methods.plan import (
    UNBOUNDED,
    AttentionPass,
    PassPlan,
    PositionMap,
    PositionPlan,
    check_inputs,
    cos_sin,
    document_starts,
    mapped_cos_sin,
    rotated_queries,
)
from longctx.model.rope import RotaryEmbedding, apply_rotary, rotation_dtype
from longctx.model.temperature import tempered


def own_positions(positions: torch.Tensor) -> torch.Tensor:
    """A pass's identity position map: queries or keys at their own positions."""
    return positions


@dataclass
class MethodPositions:
    """Per-forward state of a position method (layer_attention.Positions): q stays un-rotated and the
    method rotates each of its passes itself; keys are rotated once, at their own
    positions, when the method lets the KV cache hold rotated keys."""

    method: PositionMethod
    plan: PositionPlan
    position_ids: torch.Tensor
    """[B, Tq] positions of this forward's tokens."""
    key_rotation: tuple[torch.Tensor, torch.Tensor] | None = None
    """cos/sin of the new keys at their own positions, computed once for every layer; None
    when the cache holds un-rotated keys."""
    factor: torch.Tensor | None = None
    """[B, Tq, 1, 1] the temperature's, on the un-rotated queries (a scalar per query: the
    method's rotations commute with it); None: no temperature."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.key_rotation is not None:
            k = apply_rotary(k, *self.key_rotation)
        return tempered(q, self.factor), k

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        if sinks is not None:  # the model refuses first (layer_attention.check_method_on_layers)
            raise ValueError(f"position method {self.method.name!r} does not carry model.attention_sinks")
        return self.method(q, k, v, self.plan)


class PositionMethod(nn.Module):
    """A position method: its RoPE, its passes, and attention over un-rotated q/k/v.

        method = build_position_method(cfg.eval.position_method, cfg.model)
        plan = method.plan(position_ids, document_ids, q_len, backend=backend)   # once per forward
        out = method(q, k, v, plan)                                              # every layer

    q [B, Tq, H, D] and k/v [B, Tk, Hkv, D] with queries the last Tq key positions, as in
    `attention()`; position_ids/document_ids [B, Tk] describe the keys.
    """

    def __init__(
        self,
        name: str,
        rotary: RotaryEmbedding,
        passes: list[AttentionPass],
        *,
        params: dict | None = None,
        score_multiplier: float = 1.0,
        query_scale: Callable[[torch.Tensor], torch.Tensor] | None = None,
        decode_passes: list[AttentionPass] | None = None,
        exact_below: int | None = None,
    ):
        super().__init__()
        if not passes or decode_passes == []:
            raise ValueError(f"position method {name!r} needs at least one pass")
        self.name = name
        self.rotary = rotary
        self.passes = passes
        self.decode_passes = decode_passes
        """The passes of a single-query forward (a cached decoding step) when they differ
        from `passes` (StRing compat='repo'); None = `passes`."""
        self.params = dict(params or {})
        self.score_multiplier = score_multiplier
        self.query_scale = query_scale
        self._exact_below = exact_below
        self.rotation_free = False
        """Set by a caller that hands q/k rotated already (longctx.hf_attention) when no pass
        moves a query or key off its own position: one pass is then plain masked attention."""

    @property
    def exact_below(self) -> int:
        """Distances d < this are attended exactly as under the model's own RoPE (what a
        sliding layer of window W <= it may skip the method for, docs/design.md §8): the
        farthest distance + 1 of a pass from distance 0 at own positions, when every
        forward has one and no score multiplier or query scaling touches it; 0 otherwise.
        A builder whose passes are not bands (DCA) states it."""
        if self._exact_below is not None:
            return self._exact_below
        if self.score_multiplier != 1 or self.query_scale is not None:
            return 0
        exact = []
        for passes in (self.passes, self.decode_passes or self.passes):
            bands = [
                UNBOUNDED if p.band[1] is None else p.band[1] + 1
                for p in passes
                if p.band is not None
                and p.band[0] == 0
                and p.query_positions is own_positions
                and p.key_positions is None
            ]
            exact.append(max(bands, default=0))
        return min(exact)

    @property
    def caches_rotated_keys(self) -> bool:
        """True when every pass keeps keys at their own positions: the KV cache may hold
        keys rotated once by `rotate_keys`. False: the cache must hold un-rotated keys."""
        return all(p.key_positions is None for p in [*self.passes, *(self.decode_passes or [])])

    def passes_for(self, q_len: int) -> list[AttentionPass]:
        """The passes of a forward with `q_len` queries: `decode_passes` for one, else `passes`."""
        return self.decode_passes if q_len == 1 and self.decode_passes is not None else self.passes

    def extra_repr(self) -> str:
        return f"name={self.name!r}, " + ", ".join(f"{k}={v!r}" for k, v in self.params.items())

    def rotate_keys(self, k: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """k [B, T, Hkv, D] rotated at its own positions [B, T] by this method's RoPE."""
        if not self.caches_rotated_keys:
            raise ValueError(
                f"position method {self.name!r} rotates keys at rewritten positions; cache them un-rotated"
            )
        return apply_rotary(k, *cos_sin(self.rotary, position_ids, k.dtype))

    def plan(
        self,
        position_ids: torch.Tensor,
        document_ids: torch.Tensor | None = None,
        q_len: int | None = None,
        *,
        keys_rotated: bool = False,
        backend: str = "auto",
        block_size: int = DEFAULT_BLOCK_SIZE,
        dtype: torch.dtype = torch.float32,
    ) -> PositionPlan:
        """Everything about positions one forward pass shares across layers.

        position_ids/document_ids [B, Tk] of all keys (cache + new); q_len = number of
        queries (the last q_len keys; default all). keys_rotated: k will arrive rotated
        at its own positions (from `rotate_keys`). dtype: the dtype of q/k (rotations are
        computed in `rotation_dtype(dtype)`). backend: `attention()`'s backend; `flash`
        (or `auto` on CUDA) runs band and chunk passes on the varlen kernel (gpu.py).
        """
        if position_ids.dim() != 2:
            raise ValueError(f"position_ids must be [batch, keys], got shape {tuple(position_ids.shape)}")
        batch, kv_len = position_ids.shape
        device = position_ids.device
        q_len = kv_len if q_len is None else q_len
        if not 0 < q_len <= kv_len:
            raise ValueError(f"q_len={q_len} must be in [1, keys={kv_len}]")
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        if document_ids is None:
            document_ids = torch.zeros_like(position_ids)
        if document_ids.shape != position_ids.shape:
            raise ValueError(
                f"document_ids {tuple(document_ids.shape)} and position_ids {tuple(position_ids.shape)} differ in shape"
            )
        if keys_rotated and not self.caches_rotated_keys:
            raise ValueError(f"position method {self.name!r} needs un-rotated keys (keys_rotated=False)")
        offset = kv_len - q_len
        query_positions = position_ids[:, offset:]
        compute = rotation_dtype(dtype)
        scale_queries = self.query_scale
        query_scale = None if scale_queries is None else scale_queries(query_positions).to(compute)
        key_maps: list[PositionMap | None] = []
        key_rotations: list[tuple[torch.Tensor, torch.Tensor] | None] = []

        def key_rotation(key_map: PositionMap | None) -> int:
            if key_map not in key_maps:
                key_maps.append(key_map)
                own = key_map is None
                if own and keys_rotated:
                    key_rotations.append(None)
                else:
                    key_rotations.append(mapped_cos_sin(self.rotary, position_ids, key_map or own_positions, dtype))
            return key_maps.index(key_map)

        def plan_of(layout, passes: list[PassPlan]) -> PositionPlan:
            return PositionPlan(q_len, document_ids, keys_rotated, passes, key_rotations, layout)

        def query_rotation(position_map: PositionMap) -> tuple[torch.Tensor, torch.Tensor]:
            """cos/sin of the queries at `position_map(query_positions)`, times the query
            scale: rotating q by them rotates the scaled q (the scale is per query)."""
            cos, sin = mapped_cos_sin(self.rotary, query_positions, position_map, dtype)
            if query_scale is None:
                return cos, sin
            return cos * query_scale[..., None], sin * query_scale[..., None]

        method_passes = self.passes_for(q_len)
        if len(method_passes) == 1:
            only = method_passes[0]
            cos, sin = query_rotation(only.query_positions)
            index = key_rotation(only.key_positions)
            empty = torch.empty(0, dtype=torch.long, device=device)
            mask = build_mask(document_ids, q_len, backend, dtype=dtype)
            return plan_of(mask, [PassPlan(only.band, only.chunk, cos, sin, index, empty, empty, [])])

        document_start = document_starts(position_ids, document_ids)[:, offset:]
        bands = [p.band for p in method_passes]
        varlen = resolve_backend(backend, device, dtype) == "flash" and all(p.band or p.chunk for p in method_passes)
        query_index = torch.arange(offset, kv_len, device=device).expand(batch, -1)
        passes = []
        for attention_pass in method_passes:
            cos, sin = query_rotation(attention_pass.query_positions)
            nearest, farthest = attention_pass.distances(query_positions)
            upper = query_index - nearest
            lower = torch.maximum(document_start, query_index - farthest)
            blocks = [] if varlen else block_spans(attention_pass.band, lower, upper, block_size, kv_len)
            index = key_rotation(attention_pass.key_positions)
            passes.append(PassPlan(attention_pass.band, attention_pass.chunk, cos, sin, index, lower, upper, blocks))
        layout: VarlenLayout | TorchLayout
        if varlen:
            layout = varlen_layout(position_ids, document_ids, q_len, method_passes)
        else:
            layout = torch_layout(document_ids, q_len, block_size, any(band is not None for band in bands))
        return plan_of(layout, passes)

    def prepare(
        self,
        position_ids: torch.Tensor,
        key_position_ids: torch.Tensor,
        key_document_ids: torch.Tensor,
        q_len: int,
        *,
        backend: str,
        dtype: torch.dtype,
    ) -> MethodPositions:
        """The model's positions-provider hook (layer_attention.PositionsProvider): plan once per
        forward for queries at `position_ids` [B, Tq] and all keys (cache + new)."""
        plan = self.plan(
            key_position_ids,
            key_document_ids,
            q_len,
            keys_rotated=self.caches_rotated_keys,
            backend=backend,
            dtype=dtype,
        )
        rotation = cos_sin(self.rotary, position_ids, dtype) if self.caches_rotated_keys else None
        return MethodPositions(self, plan, position_ids, rotation)

    @property
    def fixed_shape_decoding(self) -> bool:
        """Whether a decoding step runs as `prepare_decode` (model/inference/step.py): keys cached
        rotated and every pass a distance band. ReRoPE, Self-Extend and DCA rotate keys at
        rewritten positions or cover chunks: they take the general plan."""
        return self.caches_rotated_keys and all(p.band is not None for p in self.passes_for(1))

    def prepare_decode(self, position_ids: torch.Tensor, keys: DecodeKeys, dtype: torch.dtype) -> Step:
        """A decoding step's positions (one query per row at `position_ids` [B, 1]), built
        once for every layer from device tensors only: each pass's query rotation, the new
        key's rotation, and the passes' masks over the fixed-shape read of the cache."""
        passes = self.passes_for(1)
        at = position_ids[:, 0]
        query_at = torch.stack([p.query_positions(at) for p in passes], dim=1)  # [B, P]
        cos, sin = cos_sin(self.rotary, query_at, dtype)
        if self.query_scale is not None:
            factor = self.query_scale(position_ids).to(cos.dtype)[..., None]
            cos, sin = cos * factor, sin * factor
        mask = DecodeMask(keys.allowed([p.band for p in passes if p.band is not None]), dtype, keys.kernel)
        if passes[0].query_positions is own_positions and self.query_scale is None:
            # the new key rotates with the first pass's query, as one tensor: no angles of its own
            return Step(mask, cos, signed_sin(sin), score_multiplier=self.score_multiplier)
        key_cos, key_sin = cos_sin(self.rotary, position_ids, dtype)
        return Step(mask, cos, signed_sin(sin), key_cos, signed_sin(key_sin), self.score_multiplier)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        plan: PositionPlan,
        scale: float | None = None,
        sinks: torch.Tensor | None = None,
    ):
        """Attention output [B, Tq, H, D] from un-rotated q (and k unless the plan says rotated).
        Rotations run in `rotation_dtype(q.dtype)`; every kernel gets q/k/v in q's dtype.
        `sinks` [H] (gpt-oss): one logit per query head that joins the softmax over the union
        of the passes' keys once, as a key of value 0: out = out_merged * sigmoid(lse_merged
        - s_h) with the merged log-sum-exp (model/sinks.py), so a multi-pass method counts it
        once, not once per pass."""
        check_inputs(q, k, v, plan)
        if sinks is not None and sinks.shape != (q.shape[2],):
            raise ValueError(
                f"sinks must hold one logit per query head, shape ({q.shape[2]},), got {tuple(sinks.shape)}"
            )
        scale = (q.shape[-1] ** -0.5 if scale is None else scale) * self.score_multiplier
        dtype = q.dtype
        if plan.mask is not None:
            only = plan.passes[0]
            rotation = plan.key_rotations[0]  # None: the keys arrive rotated
            keys = k if rotation is None else apply_rotary(k, *rotation)
            query = apply_rotary(q.to(rotation_dtype(dtype)), only.query_cos, only.query_sin).to(dtype)
            return attention(query, keys, v, mask=plan.mask, scale=scale, sinks=sinks)
        queries = rotated_queries(q, plan.passes)
        if plan.backend == "flash":
            rotated = [k if rotation is None else apply_rotary(k, *rotation) for rotation in plan.key_rotations]
            return varlen_passes(queries, rotated, v, plan, scale, sinks)
        return torch_passes(queries, k, v, plan, scale, sinks)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        keys_rotated: bool = False,
        backend: str = "auto",
        scale: float | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`plan` + `forward` in one call; position_ids default to 0..Tk-1 in every row."""
        if position_ids is None:
            position_ids = torch.arange(k.shape[1], device=k.device).expand(k.shape[0], -1)
        plan = self.plan(
            position_ids,
            document_ids,
            q.shape[1],
            keys_rotated=keys_rotated,
            backend=backend,
            block_size=block_size,
            dtype=q.dtype,
        )
        return self(q, k, v, plan, scale=scale, sinks=sinks)


def build_position_method(
    config: PositionMethodConfig, model: ModelConfig, prefix: str = "eval.position_method"
) -> PositionMethod:
    """The method `config.name` for a model; training length L = model.max_position.

    The method's builder (longctx.model.position_methods.registry) gets the model's RoPE,
    its own scaling included, and the parameters resolved once against L; a `rope`-kind
    method (ntk, yarn) replaces that scaling with its own. Every method keeps the model's
    `rope_position_scale` and its partial rotation (`model.rotary_fraction`,
    `model.partial_rotary`): p-rope's zero frequencies carry through every method, and
    `first` rotates the first R channels of every pass (plan.rotated_queries).

    Refused for `longrope` RoPE: its frequencies change with the forward's largest position
    and a cache crossing the switch holds keys of both sets, so q.k is no function of a
    method's rewritten distance (plain RoPE attention runs without a method, exactly)."""
    from longctx.model.position_methods.registry import builder_for

    if model.rope_scaling.type == "longrope":
        raise ValueError(
            f"position method {config.name!r} is not supported on longrope RoPE: its frequencies switch with the "
            "forward's largest position (evaluate without a position method)"
        )

    params = config.resolved(model.max_position, prefix)
    return builder_for(config.name)(RotaryEmbedding.of_model(model), **params)
