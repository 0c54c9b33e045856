"""Evaluation-time position methods: StRing and the training-free baselines (DESIGN §8).

Every method here rewrites the relative position P[m][n] = m - n that RoPE sees between a
query at position m and a key at position n (positions within a document), without
training. Each is a list of *passes*: a pass covers, for every query, a contiguous range
of key distances m - n and rotates queries and keys at its own RoPE indices. A query's
output is the softmax over the union of its passes, obtained by merging each pass's
output with its log-sum-exp in fp32:

    lse = logaddexp(lse_a, lse_b),   out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b

(= sigmoid(lse_a - lse_b) out_a + sigmoid(lse_b - lse_a) out_b, STRING Algorithm 2; a
pass that covers no key of a query has lse = -inf and weight 0).

Methods (L = training length = model.max_position; pass = [nearest, farthest] distances):

- `rope`     plain RoPE, one pass [0, inf).
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
             scores by (1 + 0.1 ln 2)^2 ~ 1.14. (Its one-token decoding path attends the
             last S keys, [0, S-1]; here both prefill and decoding use [0, S] so that
             decoding equals prefill.)
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

The paper's baseline protocol (STRING §4.2: pretend the training length is L' = 2/3 L and
extrapolate by L / L' = 1.5) is `baseline_protocol(name, L)`; config fields left at 0
take its values.

Implementations:

- pure torch (any device, the CPU default): each pass's output and log-sum-exp over all
  queries, then one merge. A pass that is a fixed distance band (string, rerope,
  self_extend) goes document by document (`_band_pass`): the queries whose band reaches
  back to the document start are one causal kernel call; the rest go in blocks of
  BAND_BLOCK queries, all blocks of a document one batched call over overlapping strided
  key windows under one shared mask. Other passes (DCA's chunk passes) go per query
  block: the keys every query of a block covers without a mask, the edges with one. On
  CPU the kernel is torch's fused flash-attention op, which also returns the log-sum-exp
  and handles GQA; elsewhere explicit fp32 math. Decoding (one query) scores each pass's
  key range with a matmul and takes one softmax over all of them, the same merge without
  per-pass outputs.
- flash (CUDA, `gpu` extra) for methods whose passes are fixed distance bands (string,
  rerope, self_extend): per pass one `flash_attn_varlen_func` over the documents, with the
  keys of each document cut `nearest` tokens short (flash's bottom-right causal mask then
  ends each query at m - nearest) and window (farthest - nearest, 0). DCA always uses the
  pure-torch path. rope/ntk/yarn call `attention()` with the chosen backend.

Position ids must increase by one inside a document (evaluation positions always do), so
a key's distance is its index distance; a plan checks this.

KV cache contract: methods with `caches_rotated_keys` (rope, ntk, yarn, string) rotate
every key once at its own position with `rotate_keys` (the method's own RoPE: ntk/yarn
differ from the model's) and attend with `keys_rotated=True`; rerope, self_extend and dca
rotate keys at rewritten positions (0, floor(n/G), n mod s), so their cache keeps
*un-rotated* keys and every step rotates the keys it reads (Self-Extend and DCA: all).

Measured (benchmarks/position_methods.py, docs/benchmarks.md; 2 threads, `tiny` shapes):
the `tiny` model with StRing vs plain RoPE, prefill 1.1-1.2x and decoding 1.0-1.1x at
T=1024 and 4096 (the STRING paper's A.3 setting); the attention operation alone, StRing
prefill 1.7x (T=1024) and 1.3x (T=4096). torch's CPU kernel computes causal squares of up
to 512 keys in full, so one causal call is hard to beat by two passes; flash-attn, which
skips masked 128-key tiles, shows no slowdown on GPU. The baselines that rewrite key
positions decode at 1.5-1.7x (model) as they rotate every key they read at every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from longctx.model.attention import (
    DEFAULT_BLOCK_SIZE,
    AttentionMask,
    attention,
    build_mask,
    document_segments,
    resolve_backend,
)
from longctx.model.llama import ConfigError, ModelConfig
from longctx.model.rope import RopeScaling, RotaryEmbedding, apply_rotary, rotate_half

POSITION_METHODS = ("rope", "ntk", "yarn", "rerope", "self_extend", "dca", "string")
BASELINE_TRAINING_FRACTION = 2 / 3
"""STRING §4.2: baselines pretend the model was trained at 2/3 of its training length."""
STRING_COMPAT = ("paper", "repo")
REPO_STRING_ATTENTION_FACTOR = 1 + 0.1 * math.log(2)
"""cos/sin multiplier of the authors' released StRing code (compat='repo')."""
UNBOUNDED = 1 << 40
"""Largest key distance of a pass without a far end."""
MIN_BULK_FRACTION = 0.5
"""A query block attends its common keys unmasked in a call of their own only when they are
at least this fraction of its key span (each kernel call costs ~0.6 ms fixed at 256 queries)."""
KEY_ALIGNMENT = 64
"""Key spans handed to the CPU kernel are multiples of this many keys where possible."""
BAND_BLOCK = 128
"""Queries per block in a windowed pass of the pure-torch path (see `_band_pass`)."""


# --- configuration --------------------------------------------------------------------


@dataclass
class StringConfig:
    """StRing (STRING §4.1). Paper: S = L/3, W = 128 for every model (Figure 7 ablation:
    W >= 32 and L/3 <= S <= L/2 work)."""

    shift: int = 0
    """Shift offset S in tokens; 0 = round(shift_ratio * L)."""
    shift_ratio: float = 1 / 3
    """S as a fraction of the training length L when `shift` is 0."""
    local_window: int = 128
    """Local window W: shifted pairs restart at relative position W. Must be < S."""
    compat: str = "paper"
    """paper: Eq. 4 exactly. repo: the authors' released code (diagonal m-n=S twice, scores x (1+0.1 ln 2)^2)."""


@dataclass
class NtkConfig:
    """NTK-aware RoPE (LocalLLaMA, 2023): base' = base * factor^(d/(d-2))."""

    factor: float = 0.0
    """Extension factor a; 0 = the baseline protocol's L / (2/3 L) = 1.5."""


@dataclass
class YarnConfig:
    """YaRN (Peng et al., 2023, §3.2-3.4), the model's rope.py implementation."""

    factor: float = 0.0
    """Extension factor s; 0 = the baseline protocol's 1.5."""
    original_max_position: int = 0
    """Context the frequencies are ramped against; 0 = the protocol's round(2/3 L)."""
    beta_fast: float = 32.0
    """Dimensions rotating more than this often over the original context extrapolate (paper: 32)."""
    beta_slow: float = 1.0
    """Dimensions rotating less than this often are interpolated (paper: 1)."""


@dataclass
class ReRopeConfig:
    """ReRoPE (Su, 2023; bojone/rerope): P' = min(P, window)."""

    window: int = 0
    """Relative positions >= window are set to window; 0 = the protocol's L'/8 (the patch's 512 at 4096)."""
    log_scale_length: int = 0
    """Queries at m scale by max(1, log(m+1)/log(this)); 0 = the protocol's L', -1 = off."""


@dataclass
class SelfExtendConfig:
    """Self-Extend (Jin et al., 2024). Extends to (L' - w_n) * G + w_n tokens."""

    neighbor_window: int = 0
    """w_n: relative positions below it are exact; 0 = the protocol's L'/4 (1024 at 4096), made a multiple of G."""
    group_size: int = 0
    """G: farther positions are floor-divided by G; 0 = the smallest G whose extended window covers L."""


@dataclass
class DcaConfig:
    """Dual Chunk Attention (An et al., 2024, §3.1); relative positions stay below chunk_size + local_window."""

    chunk_size: int = 0
    """s: keys sit at n mod s; 0 = the released ChunkLlama code's 3/4 L' - L'/8 = 5/8 L'."""
    local_window: int = 0
    """w: successive-chunk queries keep exact distances for their first w offsets; 0 = L'/8 (released code)."""


@dataclass
class PositionMethodConfig:
    """Which position method evaluation uses, and the parameters of each."""

    name: str = "rope"
    """rope | ntk | yarn | rerope | self_extend | dca | string."""
    string: StringConfig = field(default_factory=StringConfig)
    """StRing parameters (name=string)."""
    ntk: NtkConfig = field(default_factory=NtkConfig)
    """NTK-aware scaling parameters (name=ntk)."""
    yarn: YarnConfig = field(default_factory=YarnConfig)
    """YaRN parameters (name=yarn)."""
    rerope: ReRopeConfig = field(default_factory=ReRopeConfig)
    """ReRoPE parameters (name=rerope)."""
    self_extend: SelfExtendConfig = field(default_factory=SelfExtendConfig)
    """Self-Extend parameters (name=self_extend)."""
    dca: DcaConfig = field(default_factory=DcaConfig)
    """Dual Chunk Attention parameters (name=dca)."""

    def resolved(self, training_length: int, prefix: str = "eval.position_method") -> dict:
        """Parameters of the selected method with 0-valued fields filled in (by the
        baseline protocol, or StRing's shift_ratio); raises ConfigError naming the key
        (`prefix`.name, `prefix`.string.shift, ...) of an impossible value."""
        if self.name not in POSITION_METHODS:
            raise ConfigError(f"{prefix}.name", f"{self.name!r} is not one of {POSITION_METHODS}")
        if self.name == "rope":
            return {}
        if self.name == "string":
            return _resolve_string(self.string, training_length, f"{prefix}.string")
        section = getattr(self, self.name)
        protocol = baseline_protocol(self.name, training_length)
        values = {key: value or protocol[key] for key, value in vars(section).items()}
        _check_baseline(self.name, values, f"{prefix}.{self.name}")
        return values


def baseline_protocol(method_name: str, training_length: int) -> dict:
    """Parameters of a baseline under STRING §4.2's protocol: the model is treated as
    trained at L' = round(2/3 L) and extrapolated by L / L' (= 1.5) to its real length L.
    Each method's other parameters keep its own paper's/released code's proportions."""
    if method_name not in POSITION_METHODS or method_name == "string":
        raise ValueError(f"method_name={method_name!r}: the baseline protocol covers {POSITION_METHODS[:-1]}")
    if training_length < 16:
        raise ValueError(f"training_length={training_length} is too short for the baseline protocol (needs >= 16)")
    pretend = round(BASELINE_TRAINING_FRACTION * training_length)
    factor = training_length / pretend
    if method_name == "rope":
        return {}
    if method_name == "ntk":
        return {"factor": factor}
    if method_name == "yarn":
        return {"factor": factor, "original_max_position": pretend, "beta_fast": 32.0, "beta_slow": 1.0}
    if method_name == "rerope":
        return {"window": pretend // 8, "log_scale_length": pretend}
    if method_name == "self_extend":
        window = pretend // 4
        group = math.ceil((training_length - window) / (pretend - window))
        return {"neighbor_window": window - window % group, "group_size": group}
    return {"chunk_size": pretend * 3 // 4 - pretend // 8, "local_window": pretend // 8}


def _resolve_string(config: StringConfig, training_length: int, prefix: str) -> dict:
    if config.compat not in STRING_COMPAT:
        raise ConfigError(f"{prefix}.compat", f"{config.compat!r} is not one of {STRING_COMPAT}")
    if config.shift < 0:
        raise ConfigError(f"{prefix}.shift", f"must be >= 0 (0 = shift_ratio * L), got {config.shift}")
    shift = config.shift or round(config.shift_ratio * training_length)
    if shift <= 0:
        raise ConfigError(
            f"{prefix}.shift_ratio", f"gives shift S = round({config.shift_ratio} * {training_length}) = {shift}; S must be > 0"
        )
    if not 0 <= config.local_window < shift:
        raise ConfigError(
            f"{prefix}.local_window",
            f"must be in [0, shift S={shift}), got {config.local_window} (STRING Eq. 4 needs W < S)",
            (f"{prefix}.shift", f"{prefix}.shift_ratio"),
        )
    return {"shift": shift, "local_window": config.local_window, "compat": config.compat}


def _check_baseline(name: str, values: dict, prefix: str) -> None:
    positive = {
        "ntk": ("factor",),
        "yarn": ("factor", "original_max_position"),
        "rerope": ("window",),
        "self_extend": ("neighbor_window", "group_size"),
        "dca": ("chunk_size", "local_window"),
    }[name]
    for key in positive:
        if values[key] <= 0:
            raise ConfigError(f"{prefix}.{key}", f"must be > 0, got {values[key]}")
    if name in ("ntk", "yarn") and values["factor"] < 1:
        raise ConfigError(f"{prefix}.factor", f"must be >= 1, got {values['factor']}")
    if name == "yarn" and values["beta_fast"] <= values["beta_slow"]:
        raise ConfigError(f"{prefix}.beta_fast", f"{values['beta_fast']} must exceed beta_slow={values['beta_slow']}")
    if name == "rerope" and values["log_scale_length"] != -1 and values["log_scale_length"] < 2:
        raise ConfigError(f"{prefix}.log_scale_length", f"must be >= 2 or -1 (off), got {values['log_scale_length']}")
    if name == "dca" and values["local_window"] > values["chunk_size"]:
        raise ConfigError(
            f"{prefix}.local_window",
            f"{values['local_window']} exceeds chunk_size={values['chunk_size']}",
            (f"{prefix}.chunk_size",),
        )


# --- passes and methods ---------------------------------------------------------------

PositionMap = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class AttentionPass:
    """One softmax of a method: which keys each query covers and where RoPE puts them.

    A query at position p covers the keys of its document at distances p - n in
    [nearest, farthest] = `distances(p)` (inclusive; farthest may be UNBOUNDED).
    """

    name: str
    distances: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    """Query positions -> (nearest, farthest) distances covered."""
    query_positions: PositionMap
    """Query positions -> the RoPE index queries are rotated at in this pass."""
    key_positions: PositionMap | None = None
    """Key positions -> their RoPE index; None = their own position (cache-friendly)."""
    band: tuple[int, int | None] | None = None
    """(nearest, farthest or None) when the same for every query: the flash path needs it."""


def band_pass(
    name: str, nearest: int, farthest: int | None, query_positions: PositionMap, key_positions: PositionMap | None = None
) -> AttentionPass:
    """A pass covering the same distances [nearest, farthest] for every query."""

    def distances(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        far = UNBOUNDED if farthest is None else farthest
        return torch.full_like(positions, nearest), torch.full_like(positions, far)

    return AttentionPass(name, distances, query_positions, key_positions, (nearest, farthest))


def _own(positions: torch.Tensor) -> torch.Tensor:
    return positions


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
    ):
        super().__init__()
        if not passes:
            raise ValueError(f"position method {name!r} needs at least one pass")
        self.name = name
        self.rotary = rotary
        self.passes = passes
        self.params = dict(params or {})
        self.score_multiplier = score_multiplier
        self.query_scale = query_scale

    @property
    def caches_rotated_keys(self) -> bool:
        """True when every pass keeps keys at their own positions: the KV cache may hold
        keys rotated once by `rotate_keys`. False: the cache must hold un-rotated keys."""
        return all(p.key_positions is None for p in self.passes)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, " + ", ".join(f"{k}={v!r}" for k, v in self.params.items())

    def rotate_keys(self, k: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """k [B, T, Hkv, D] rotated at its own positions [B, T] by this method's RoPE."""
        if not self.caches_rotated_keys:
            raise ValueError(f"position method {self.name!r} rotates keys at rewritten positions; cache them un-rotated")
        return apply_rotary(k, *_cos_sin(self.rotary, position_ids, k.dtype))

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
        at its own positions (from `rotate_keys`). dtype: the dtype of q/k.
        """
        return _make_plan(self, position_ids, document_ids, q_len, keys_rotated, backend, block_size, dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PositionPlan, scale: float | None = None):
        """Attention output [B, Tq, H, D] from un-rotated q (and k unless the plan says rotated)."""
        _check_inputs(q, k, v, plan)
        scale = (q.shape[-1] ** -0.5 if scale is None else scale) * self.score_multiplier
        if plan.query_scale is not None:
            q = q * plan.query_scale[:, :, None, None]
        if plan.mask is not None:
            only = plan.passes[0]
            keys = k if plan.keys_rotated else apply_rotary(k, *plan.key_rotations[0])
            return attention(apply_rotary(q, only.query_cos, only.query_sin), keys, v, mask=plan.mask, scale=scale)
        swapped = rotate_half(q)  # shared by every pass's rotation
        queries = [torch.addcmul(q * p.query_cos[:, :, None], swapped, p.query_sin[:, :, None]) for p in plan.passes]
        if plan.q_len == 1 and plan.backend != "flash":
            return _decode_passes(queries, k, v, plan, scale)
        keys = [k if rotation is None else apply_rotary(k, *rotation) for rotation in plan.key_rotations]
        if plan.backend == "flash":
            return _flash_passes(queries, keys, v, plan, scale)
        return _torch_passes(queries, keys, v, plan, scale)

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
    ) -> torch.Tensor:
        """`plan` + `forward` in one call; position_ids default to 0..Tk-1 in every row."""
        if position_ids is None:
            position_ids = torch.arange(k.shape[1], device=k.device).expand(k.shape[0], -1)
        plan = self.plan(
            position_ids, document_ids, q.shape[1],
            keys_rotated=keys_rotated, backend=backend, block_size=block_size, dtype=q.dtype,
        )  # fmt: skip
        return self(q, k, v, plan, scale=scale)


# --- the methods ----------------------------------------------------------------------


def rope_method(rotary: RotaryEmbedding, name: str = "rope", params: dict | None = None) -> PositionMethod:
    """Plain RoPE with `rotary` (also the body of ntk and yarn)."""
    return PositionMethod(name, rotary, [band_pass("causal", 0, None, _own)], params=params)


def ntk_method(head_dim: int, base: float, factor: float, training_length: int) -> PositionMethod:
    """NTK-aware scaling: RoPE with base * factor^(d/(d-2)) (rope.py's `ntk`)."""
    rotary = RotaryEmbedding(head_dim, base, RopeScaling("ntk", factor=factor), training_length)
    return rope_method(rotary, "ntk", {"factor": factor})


def yarn_method(
    head_dim: int, base: float, factor: float, original_max_position: int, training_length: int,
    beta_fast: float = 32.0, beta_slow: float = 1.0,
) -> PositionMethod:  # fmt: skip
    """YaRN: rope.py's `yarn` frequencies and cos/sin attention factor."""
    scaling = RopeScaling(
        "yarn", factor=factor, original_max_position=original_max_position, beta_fast=beta_fast, beta_slow=beta_slow
    )
    rotary = RotaryEmbedding(head_dim, base, scaling, training_length)
    params = {"factor": factor, "original_max_position": original_max_position, "beta_fast": beta_fast, "beta_slow": beta_slow}
    return rope_method(rotary, "yarn", params)


def string_method(rotary: RotaryEmbedding, shift: int, local_window: int = 128, compat: str = "paper") -> PositionMethod:
    """StRing (STRING Eq. 4) with shift S and local window W; see the module docstring."""
    if shift <= 0:
        raise ValueError(f"StRing shift S must be > 0, got {shift}")
    if not 0 <= local_window < shift:
        raise ValueError(f"StRing local_window W must be in [0, shift S={shift}), got {local_window}")
    if compat not in STRING_COMPAT:
        raise ValueError(f"StRing compat={compat!r} is not one of {STRING_COMPAT}")
    diagonal_end = shift if compat == "repo" else shift - 1
    passes = [
        band_pass("diagonal", 0, diagonal_end, _own),
        band_pass("shifted", shift, None, lambda p: p - shift + local_window),
    ]
    multiplier = REPO_STRING_ATTENTION_FACTOR**2 if compat == "repo" else 1.0
    params = {"shift": shift, "local_window": local_window, "compat": compat}
    return PositionMethod("string", rotary, passes, params=params, score_multiplier=multiplier)


def rerope_method(rotary: RotaryEmbedding, window: int, log_scale_length: int = -1) -> PositionMethod:
    """ReRoPE: P' = min(P, window); log-n query scaling against log_scale_length (-1 = off)."""
    if window <= 0:
        raise ValueError(f"ReRoPE window must be > 0, got {window}")
    passes = [
        band_pass("window", 0, window - 1, _own),
        band_pass("rectified", window, None, lambda p: torch.full_like(p, window), torch.zeros_like),
    ]
    query_scale = None
    if log_scale_length > 0:
        log_length = math.log(log_scale_length)

        def query_scale(positions: torch.Tensor) -> torch.Tensor:
            return (torch.log1p(positions.double()) / log_length).clamp(min=1)

    params = {"window": window, "log_scale_length": log_scale_length}
    return PositionMethod("rerope", rotary, passes, params=params, query_scale=query_scale)


def self_extend_method(rotary: RotaryEmbedding, neighbor_window: int, group_size: int) -> PositionMethod:
    """Self-Extend: exact below neighbor_window, grouped (floor-divided by group_size) beyond."""
    if neighbor_window <= 0 or group_size <= 0:
        raise ValueError(f"Self-Extend needs neighbor_window > 0 and group_size > 0, got {neighbor_window}, {group_size}")
    offset = neighbor_window - neighbor_window // group_size
    passes = [
        band_pass("neighbor", 0, neighbor_window - 1, _own),
        band_pass(
            "grouped", neighbor_window, None,
            lambda p: torch.div(p, group_size, rounding_mode="floor") + offset,
            lambda p: torch.div(p, group_size, rounding_mode="floor"),
        ),
    ]  # fmt: skip
    params = {"neighbor_window": neighbor_window, "group_size": group_size}
    return PositionMethod("self_extend", rotary, passes, params=params)


def dca_method(rotary: RotaryEmbedding, chunk_size: int, local_window: int) -> PositionMethod:
    """Dual Chunk Attention with chunk size s and local window w (c = s + w)."""
    if chunk_size <= 0 or not 0 < local_window <= chunk_size:
        raise ValueError(f"DCA needs chunk_size > 0 and 0 < local_window <= chunk_size, got {chunk_size}, {local_window}")
    s, last = chunk_size, chunk_size + local_window - 1

    def in_chunk(p: torch.Tensor) -> torch.Tensor:
        return torch.remainder(p, s)

    def intra(p):
        return torch.zeros_like(p), in_chunk(p)

    def successive(p):
        return in_chunk(p) + 1, in_chunk(p) + s

    def inter(p):
        return in_chunk(p) + s + 1, torch.full_like(p, UNBOUNDED)

    passes = [
        AttentionPass("intra", intra, in_chunk, in_chunk),
        AttentionPass("successive", successive, lambda p: (in_chunk(p) + s).clamp(max=last), in_chunk),
        AttentionPass("inter", inter, lambda p: torch.full_like(p, last), in_chunk),
    ]
    params = {"chunk_size": chunk_size, "local_window": local_window}
    return PositionMethod("dca", rotary, passes, params=params)


def build_position_method(
    config: PositionMethodConfig, model: ModelConfig, prefix: str = "eval.position_method"
) -> PositionMethod:
    """The method `config.name` for a model; training length L = model.max_position.

    rope, string, rerope, self_extend and dca use the model's RoPE (including its own
    scaling); ntk and yarn replace the model's scaling with theirs."""
    params = config.resolved(model.max_position, prefix)
    rotary = RotaryEmbedding(model.head_dim, model.rope_base, model.rope_scaling, model.max_position)
    name = config.name
    if name == "rope":
        return rope_method(rotary)
    if name == "string":
        return string_method(rotary, **params)
    if name == "ntk":
        return ntk_method(model.head_dim, model.rope_base, params["factor"], model.max_position)
    if name == "yarn":
        return yarn_method(model.head_dim, model.rope_base, training_length=model.max_position, **params)
    if name == "rerope":
        return rerope_method(rotary, **params)
    if name == "self_extend":
        return self_extend_method(rotary, **params)
    return dca_method(rotary, **params)


def string_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    shift: int,
    local_window: int = 128,
    compat: str = "paper",
    position_ids: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    rope_base: float = 10000.0,
    rope_scaling: RopeScaling | None = None,
    max_position: int | None = None,
    scale: float | None = None,
    backend: str = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> torch.Tensor:
    """StRing attention from un-rotated q [B, Tq, H, D], k/v [B, Tk, Hkv, D].

    position_ids/document_ids [B, Tk] describe the keys (queries are the last Tq); RoPE
    is `rope_base` with `rope_scaling` (max_position: the context that scaling is
    relative to, default Tk)."""
    rotary = RotaryEmbedding(q.shape[-1], rope_base, rope_scaling or RopeScaling(), max_position or k.shape[1]).to(q.device)
    method = string_method(rotary, shift, local_window, compat)
    return method.attend(
        q, k, v, position_ids=position_ids, document_ids=document_ids, backend=backend, scale=scale, block_size=block_size
    )


# --- planning ---------------------------------------------------------------------------


@dataclass
class PassPlan:
    """One pass of one forward: rotations, per-query key ranges and per-block work."""

    band: tuple[int, int | None] | None
    """The pass's fixed distance band, if it has one (AttentionPass.band)."""
    query_cos: torch.Tensor
    """[B, Tq, D] cos of the queries' rotation in this pass."""
    query_sin: torch.Tensor
    """[B, Tq, D] sin of the same."""
    key_rotation: int
    """Index into PositionPlan.key_rotations."""
    lower: torch.Tensor
    """[B, Tq] first key index covered (inclusive)."""
    upper: torch.Tensor
    """[B, Tq] last key index covered (inclusive); < lower where the pass covers nothing."""
    blocks: list[list[KeySpans | None]]
    """Per row, per query block: the keys the block attends in this pass, or None if none."""
    flash_keys: _FlashKeys | None = None
    """The flash path's key layout for this pass."""


@dataclass
class PositionPlan:
    """What `PositionMethod.forward` needs about positions; built once per forward."""

    backend: str
    """The resolved `attention()` backend for single-pass methods; 'torch' or 'flash' for the others."""
    q_len: int
    document_ids: torch.Tensor
    """[B, Tk] document id of every key."""
    keys_rotated: bool
    block_size: int
    passes: list[PassPlan]
    key_rotations: list[tuple[torch.Tensor, torch.Tensor] | None]
    """cos/sin [B, Tk, D] for each distinct key position map; None = keys arrive rotated."""
    query_scale: torch.Tensor | None
    """[B, Tq] query multiplier (ReRoPE's log-n), or None."""
    mask: AttentionMask | None = None
    """Single-pass methods: the mask for `attention()`."""
    flash_queries: _FlashQueries | None = None
    """The flash path's query layout (documents laid end to end)."""
    documents: list[_Document] = field(default_factory=list)
    """The torch path's documents with queries, for passes with a fixed band."""


def _cos_sin(rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., D] at `positions` [...]; float64 angles for float64 inputs, else float32 (as rope.py)."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    angles = positions.to(compute)[..., None] * rotary.inv_freq.to(positions.device, compute)
    angles = torch.cat([angles, angles], dim=-1)
    factor = rotary.attention_factor
    return (angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)


def _document_starts(position_ids: torch.Tensor, document_ids: torch.Tensor) -> torch.Tensor:
    """[B, Tk] key index where each key's document starts; checks that positions step by
    one inside documents (then a key's distance is its index distance)."""
    same_document = document_ids[:, 1:] == document_ids[:, :-1]
    bad = (position_ids[:, 1:] - position_ids[:, :-1] != 1) & same_document
    if bad.any():
        row, index = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            "position methods need position_ids that increase by 1 inside each document; "
            f"row {row} goes {int(position_ids[row, index])} -> {int(position_ids[row, index + 1])} at key index {index + 1}"
        )
    index = torch.arange(document_ids.shape[1], device=document_ids.device).expand_as(document_ids)
    is_start = torch.nn.functional.pad(~same_document, (1, 0), value=True)
    return torch.where(is_start, index, 0).cummax(dim=1).values


def _make_plan(method, position_ids, document_ids, q_len, keys_rotated, backend, block_size, dtype) -> PositionPlan:
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
    if keys_rotated and not method.caches_rotated_keys:
        raise ValueError(f"position method {method.name!r} needs un-rotated keys (keys_rotated=False)")
    offset = kv_len - q_len
    query_positions = position_ids[:, offset:]
    query_scale = None if method.query_scale is None else method.query_scale(query_positions).to(dtype)
    key_maps: list[PositionMap | None] = []
    key_rotations = []

    def key_rotation(key_map: PositionMap | None) -> int:
        if key_map not in key_maps:
            key_maps.append(key_map)
            own = key_map is None
            rotated = own and keys_rotated
            at = position_ids if own else key_map(position_ids)
            key_rotations.append(None if rotated else _cos_sin(method.rotary, at, dtype))
        return key_maps.index(key_map)

    if len(method.passes) == 1:
        only = method.passes[0]
        cos, sin = _cos_sin(method.rotary, only.query_positions(query_positions), dtype)
        index = key_rotation(only.key_positions)
        empty = torch.empty(0, dtype=torch.long, device=device)
        mask = build_mask(document_ids, q_len, backend)
        pass_plan = PassPlan(only.band, cos, sin, index, empty, empty, [])
        return PositionPlan(
            mask.backend, q_len, document_ids, keys_rotated, block_size, [pass_plan], key_rotations, query_scale, mask
        )

    document_start = _document_starts(position_ids, document_ids)[:, offset:]
    resolved = resolve_backend(backend, device)
    flash = resolved == "flash" and all(p.band is not None for p in method.passes)
    query_index = torch.arange(offset, kv_len, device=device).expand(batch, -1)
    rotated_at = torch.stack([p.query_positions(query_positions) for p in method.passes])
    query_cos, query_sin = _cos_sin(method.rotary, rotated_at, dtype)
    segments = _flash_segments(document_ids, q_len) if flash else None
    passes = []
    for attention_pass, cos, sin in zip(method.passes, query_cos, query_sin):
        nearest, farthest = attention_pass.distances(query_positions)
        upper = query_index - nearest
        lower = torch.maximum(document_start, query_index - farthest)
        by_blocks = not flash and q_len > 1 and attention_pass.band is None
        blocks = _block_spans(lower, upper, block_size, kv_len) if by_blocks else []
        flash_keys = _cut_segments(segments, attention_pass.band[0]) if flash else None
        index = key_rotation(attention_pass.key_positions)
        passes.append(PassPlan(attention_pass.band, cos, sin, index, lower, upper, blocks, flash_keys))
    return PositionPlan(
        "flash" if flash else "torch", q_len, document_ids, keys_rotated, block_size, passes, key_rotations, query_scale,
        flash_queries=segments.queries if flash else None,
        documents=[] if flash or q_len == 1 else _documents(document_ids, q_len),
    )  # fmt: skip


@dataclass(frozen=True)
class KeySpans:
    """The keys one query block attends in one pass, as key-index ranges [start, end)."""

    bulk: tuple[int, int] | None
    """Keys every query of the block attends: no mask."""
    masked: tuple[tuple[int, int], ...]
    """Keys attended under a mask built from each query's [lower, upper]."""
    has_empty_rows: bool
    """Some query of the block covers no key in this pass."""


def _block_spans(lower: torch.Tensor, upper: torch.Tensor, block_size: int, kv_len: int) -> list[list[KeySpans | None]]:
    """Per row and query block: the keys its queries cover, as the bulk that every query
    covers (no mask) plus masked edges. Inside a long document lower/upper grow with the
    query, so the edges are about one block wide on each side of the bulk.

    The fused CPU kernel is ~1.5x slower per key on spans that are not a multiple of
    KEY_ALIGNMENT keys, so the bulk is cut to a multiple and the edges are widened
    outwards into keys no query of the block covers (the mask removes them)."""
    batch, q_len = lower.shape
    blocks = -(-q_len // block_size)
    pad = blocks * block_size - q_len
    valid = (torch.arange(blocks * block_size, device=lower.device) < q_len).view(blocks, block_size)
    lower, upper = (torch.nn.functional.pad(t, (0, pad)).view(batch, blocks, block_size) for t in (lower, upper))
    covered = valid & (upper >= lower)
    first = torch.where(covered, lower, UNBOUNDED).amin(-1)
    end = torch.where(covered, upper, -UNBOUNDED).amax(-1) + 1
    common_first = torch.where(covered, lower, -UNBOUNDED).amax(-1)
    common_end = torch.where(covered, upper, UNBOUNDED).amin(-1) + 1
    has_empty = (valid & ~covered).any(-1)
    columns = (first, end, common_first, common_end, has_empty, covered.any(-1))
    return [
        [_spans(*block, kv_len) if block[-1] else None for block in zip(*(column.tolist() for column in row))]
        for row in zip(*columns)
    ]


def _spans(first: int, end: int, common_first: int, common_end: int, has_empty: bool, nonempty: bool, kv_len: int) -> KeySpans:
    bulk_len = max(common_end - common_first, 0) // KEY_ALIGNMENT * KEY_ALIGNMENT
    if bulk_len < MIN_BULK_FRACTION * (end - first):  # too few common keys to be worth a call of their own
        return KeySpans(None, (_widen(first, end, kv_len),), has_empty)
    bulk_end = common_first + bulk_len
    left = _widen(first, common_first, kv_len, up=False) if common_first > first else None
    right = _widen(bulk_end, end, kv_len, down=False) if end > bulk_end else None
    return KeySpans((common_first, bulk_end), tuple(edge for edge in (left, right) if edge), has_empty)


def _widen(start: int, end: int, kv_len: int, *, down: bool = True, up: bool = True) -> tuple[int, int]:
    """[start, end) grown towards a multiple of KEY_ALIGNMENT keys, downwards first where
    allowed, never below 0 or past kv_len. Callers allow only directions whose keys the
    block does not cover (never into the bulk)."""
    missing = -(end - start) % KEY_ALIGNMENT
    below = min(missing, start) if down else 0
    above = min(missing - below, kv_len - end) if up else 0
    return start - below, end + above


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PositionPlan) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"expected q [B,Tq,H,D], k/v [B,Tk,Hkv,D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] % k.shape[2]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or head_dim, or heads are not a multiple"
        )
    if (q.shape[1], k.shape[:2]) != (plan.q_len, plan.document_ids.shape):
        raise ValueError(
            f"plan was built for q_len={plan.q_len} and keys {tuple(plan.document_ids.shape)}; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )


# --- pure-torch passes ------------------------------------------------------------------


class _Document(NamedTuple):
    """One document of one row: where its keys lie and how many of them are queries."""

    row: int
    key_start: int
    """Index of its first key in the row."""
    keys: int
    queries: int
    """Its last `queries` keys are queries (all of them in prefill)."""


def _documents(document_ids: torch.Tensor, q_len: int) -> list[_Document]:
    starts, k_lengths, q_lengths = document_segments(document_ids, q_len)
    kv_len = document_ids.shape[1]
    return [
        _Document(start // kv_len, start % kv_len, keys, queries)
        for start, keys, queries in zip(starts.tolist(), k_lengths.tolist(), q_lengths.tolist())
        if queries > 0
    ]


def _torch_passes(queries: list[torch.Tensor], keys: list[torch.Tensor], v: torch.Tensor, plan: PositionPlan, scale: float):
    """Every pass's output and log-sum-exp over all queries, then one merge across passes."""
    parts = []
    for pass_plan, query in zip(plan.passes, queries):
        key = keys[pass_plan.key_rotation]
        if pass_plan.band is not None:
            parts.append(_band_pass(query, key, v, pass_plan.band, plan.documents, scale))
        else:
            parts.append(_block_pass(query, key, v, pass_plan, plan.block_size, scale))
    return _merge(parts)[0].to(v.dtype)


def _band_pass(q, k, v, band: tuple[int, int | None], documents: list[_Document], scale: float):
    """One pass that covers key distances [nearest, farthest] of every query, document by
    document. With i a query's index in its document, it attends keys [max(0, i -
    farthest), i - nearest]; queries i < nearest attend nothing. Three regions:

    - i < farthest (all queries when farthest = inf): the band reaches the document start,
      so query i sees keys [0, i - nearest]: one causal square of these queries against
      the keys cut `nearest` short (plus, in chunked prefill, an unmasked rectangle of the
      keys before the chunk's first query).
    - then blocks of BAND_BLOCK queries: block [a, a + b) sees keys [a - farthest, a + b -
      nearest), w - 1 + b of them for a window of w = farthest - nearest + 1 distances,
      under one mask that is the same for every block. All blocks of a document are one
      batched kernel call over overlapping strided windows of the keys.
    - the last < BAND_BLOCK queries: one masked call.

    Kernel work: the causal square as torch computes it, plus T (w - 1 + b) for the
    blocks, b^2 more than the band's pairs per block. (Unmasked calls for the blocks'
    causal edges would not save work: the CPU kernel computes key spans up to 512 in full,
    masked or causal, and a mask costs ~5% per pair.)

    q [B, Tq, H, D], k/v [B, Tk, Hkv, D]. Returns output [B, Tq, H, D] and log-sum-exp
    [B, Tq, H] in fp32 (fp64 for fp64 inputs); queries the band misses get 0 and -inf."""
    nearest, farthest = band
    batch, q_len, heads, dim = q.shape
    merge_dtype = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(batch, q_len, heads, dim, dtype=merge_dtype, device=q.device)
    lse = torch.full((batch, q_len, heads), -math.inf, dtype=merge_dtype, device=q.device)
    offset = k.shape[1] - q_len
    block_mask = None if farthest is None else _window_mask(BAND_BLOCK, farthest - nearest + 1, q.device)
    for doc in documents:
        query_base = doc.key_start - offset  # index in q of the document's position 0

        def query(i: int, j: int) -> torch.Tensor:  # the queries with document index in [i, j)
            return q[doc.row, query_base + i : query_base + j]

        def key_value(i: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
            return k[doc.row, doc.key_start + i : doc.key_start + j], v[doc.row, doc.key_start + i : doc.key_start + j]

        def write(i: int, result: tuple[torch.Tensor, torch.Tensor]) -> None:
            rows = slice(query_base + i, query_base + i + result[0].shape[0])
            out[doc.row, rows], lse[doc.row, rows] = result

        first = max(doc.keys - doc.queries, nearest)
        if first >= doc.keys:
            continue
        reaching_start = doc.keys if farthest is None else min(doc.keys, farthest)
        if first < reaching_start:
            rows = query(first, reaching_start)[None]
            parts = [_squeeze(_kernel(rows, *_unsqueeze(key_value(first - nearest, reaching_start - nearest)), scale, causal=True))]
            if first > nearest:  # chunked prefill: the keys before the chunk, seen by all its queries
                parts.append(_squeeze(_kernel(rows, *_unsqueeze(key_value(0, first - nearest)), scale)))
            write(first, _merge(parts))
        start = max(first, reaching_start)
        blocks = (doc.keys - start) // BAND_BLOCK
        end = start + blocks * BAND_BLOCK
        if blocks:
            rows = query(start, end).unflatten(0, (blocks, BAND_BLOCK))
            span = block_mask.shape[1]
            windows = (
                t.unfold(0, span, BAND_BLOCK).permute(0, 3, 1, 2)
                for t in key_value(start - farthest, end - BAND_BLOCK - farthest + span)
            )
            block_out, block_lse = _kernel(rows, *windows, scale, allowed=block_mask)
            write(start, (block_out.flatten(0, 1), block_lse.flatten(0, 1)))
        if end < doc.keys:
            first_key = end - farthest
            allowed = _window_mask(doc.keys - end, farthest - nearest + 1, q.device)
            write(end, _squeeze(_kernel(query(end, doc.keys)[None], *_unsqueeze(key_value(first_key, doc.keys - nearest)), scale, allowed=allowed)))
    return out, lse


def _window_mask(queries: int, width: int, device: torch.device) -> torch.Tensor:
    """[queries, width - 1 + queries] boolean: query p sees keys [p, p + width - 1], the
    keys of a block of consecutive queries under a band of `width` distances."""
    query_index = torch.arange(queries, device=device)[:, None]
    key_index = torch.arange(width - 1 + queries, device=device)
    return (key_index >= query_index) & (key_index <= query_index + width - 1)


def _unsqueeze(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(t[None] for t in tensors)


def _squeeze(result: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return result[0][0], result[1][0]


def _block_pass(q, k, v, pass_plan: PassPlan, block_size: int, scale: float):
    """One pass with per-query key ranges (DCA's chunk passes), queries in blocks of
    `block_size`: each block attends the keys all its queries cover without a mask and
    the edges around them with one (`_block_spans`). Same layout as `_band_pass`."""
    batch, q_len, heads, dim = q.shape
    merge_dtype = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(batch, q_len, heads, dim, dtype=merge_dtype, device=q.device)
    lse = torch.full((batch, q_len, heads), -math.inf, dtype=merge_dtype, device=q.device)
    for b in range(batch):
        for block, q_start in enumerate(range(0, q_len, block_size)):
            spans = pass_plan.blocks[b][block]
            if spans is None:
                continue
            rows = slice(q_start, min(q_start + block_size, q_len))
            query, key, value = q[b, rows][None], k[b], v[b]
            lower, upper = pass_plan.lower[b, rows], pass_plan.upper[b, rows]
            parts = []
            if spans.bulk is not None:
                start, end = spans.bulk
                empty = upper < lower if spans.has_empty_rows else None
                parts.append(_empty_rows(_squeeze(_kernel(query, key[None, start:end], value[None, start:end], scale)), empty))
            if spans.masked:
                key_index = torch.cat([torch.arange(start, end, device=v.device) for start, end in spans.masked])
                allowed = (key_index >= lower[:, None]) & (key_index <= upper[:, None])
                empty = _covered_count(lower, upper, spans.masked) == 0
                masked_k, masked_v = _gather_ranges(key, spans.masked), _gather_ranges(value, spans.masked)
                parts.append(_empty_rows(_squeeze(_kernel(query, masked_k[None], masked_v[None], scale, allowed=allowed)), empty))
            out[b, rows], lse[b, rows] = _merge(parts)
    return out, lse


def _decode_passes(queries: list[torch.Tensor], k: torch.Tensor, v: torch.Tensor, plan: PositionPlan, scale: float):
    """One query per row: each pass covers one contiguous key range, so a row takes one
    kernel call per pass over exactly that range, merged as everywhere else. Keys are
    rotated only in the ranges a pass reads (ReRoPE's window, say, rather than the whole
    cache). Decoding is dominated by op count: a kernel call costs ~50 us here, scoring by
    hand (matmul, softmax, matmul per pass) cost 1.5x as much."""
    batch, _, heads, dim = queries[0].shape
    ranges = [list(zip(p.lower[:, 0].tolist(), p.upper[:, 0].tolist())) for p in plan.passes]
    out = torch.empty(batch, 1, heads, dim, dtype=v.dtype, device=v.device)
    for b in range(batch):
        parts = []
        for pass_plan, query, pass_ranges in zip(plan.passes, queries, ranges):
            start, last = pass_ranges[b]
            if last < start:
                continue
            keys = k[b : b + 1, start : last + 1]
            rotation = plan.key_rotations[pass_plan.key_rotation]
            if rotation is not None:
                keys = apply_rotary(keys, *(t[b : b + 1, start : last + 1] for t in rotation))
            parts.append(_kernel(query[b : b + 1], keys, v[b : b + 1, start : last + 1], scale))
        out[b] = _merge(parts)[0][0].to(v.dtype)
    return out


def _covered_count(lower: torch.Tensor, upper: torch.Tensor, ranges: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """For each query, how many keys of the index ranges [start, end) lie in [lower, upper]."""
    count = torch.zeros_like(lower)
    for start, end in ranges:
        count += (torch.minimum(upper, torch.full_like(upper, end - 1)) - torch.clamp(lower, min=start) + 1).clamp(min=0)
    return count


def _gather_ranges(x: torch.Tensor, ranges: tuple[tuple[int, int], ...]) -> torch.Tensor:
    if len(ranges) == 1:
        return x[ranges[0][0] : ranges[0][1]]
    return torch.cat([x[start:end] for start, end in ranges])

def _kernel(q, k, v, scale: float, *, causal: bool = False, allowed: torch.Tensor | None = None):
    """Softmax attention of q [N, Tq, H, D] over k/v [N, Tk, Hkv, D] (query head h reads
    key head h // (H / Hkv)); causal: query t sees keys <= t (top-left aligned); allowed:
    a [Tq, Tk] boolean mask. Every query must see some key. Returns the output [N, Tq, H, D]
    and log-sum-exp [N, Tq, H] in fp32 (fp64 for fp64 inputs). On CPU this is torch's fused
    flash kernel, which skips the masked half of a causal square; elsewhere fp32 math."""
    q4, k4, v4 = (t.transpose(1, 2) for t in (q, k, v))
    bias = None
    if allowed is not None:
        bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, -math.inf)
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q4, k4, v4, 0.0, causal, attn_mask=bias, scale=scale
        )
    else:
        out, lse = _attend_math(q4, k4, v4, bias, causal, scale)
    merge_dtype = torch.promote_types(q.dtype, torch.float32)
    return out.transpose(1, 2).to(merge_dtype), lse.transpose(1, 2).to(merge_dtype)


def _empty_rows(result: tuple[torch.Tensor, torch.Tensor], empty: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Output 0 and log-sum-exp -inf for the queries flagged in `empty` [Tq] (they saw
    only masked keys, which the kernel does not report)."""
    out, lse = result
    if empty is None or not bool(empty.any()):
        return out, lse
    return out.masked_fill(empty[:, None, None], 0.0), lse.masked_fill(empty[:, None], -math.inf)


def _attend_math(q, k, v, bias, causal: bool, scale: float):
    """The reference for devices without the CPU kernel: q [N, H, Tq, D], k/v [N, Hkv, Tk, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * scale
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores[0, 0], dtype=torch.bool).triu(1), -math.inf)
    if bias is not None:
        scores = scores + bias.float()
    lse = scores.logsumexp(-1)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("bhqk,bhkd->bhqd", weights, v.float()), lse


def _merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the union of several key sets from each one's output [..., D] and
    log-sum-exp [...], in fp32: for two, out_b + sigmoid(lse_a - lse_b) (out_a - out_b)
    (STRING Algorithm 2); for more, sum_i exp(lse_i - logsumexp_j lse_j) out_i. A part with
    lse -inf weighs 0. Returns the merged output and log-sum-exp."""
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        (out_a, lse_a), (out_b, lse_b) = parts
        weight_a = torch.sigmoid(lse_a - lse_b).nan_to_num_(0.0)  # nan: neither part covers the query
        return torch.addcmul(out_b, weight_a[..., None], out_a - out_b), torch.logaddexp(lse_a, lse_b)
    outs = torch.stack([out for out, _ in parts])
    lses = torch.stack([lse for _, lse in parts])
    total = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - total).nan_to_num_(0.0)
    return (outs * weights[..., None]).sum(0), total



# --- flash-attn passes (CUDA) -----------------------------------------------------------


def _flash_passes(queries: list[torch.Tensor], keys: list[torch.Tensor], v: torch.Tensor, plan: PositionPlan, scale: float):
    from flash_attn import flash_attn_varlen_func

    batch, q_len, heads, dim = queries[0].shape
    kv_heads = v.shape[2]
    flat_v = v.reshape(-1, kv_heads, dim)
    merge_dtype = torch.promote_types(v.dtype, torch.float32)
    parts = []
    for pass_plan, q_rot in zip(plan.passes, queries):
        nearest, farthest = pass_plan.band
        layout = pass_plan.flash_keys
        empty = (pass_plan.upper < pass_plan.lower).reshape(-1, 1)
        if layout.max_seqlen_k == 0:  # every document is shorter than `nearest`: nothing to attend
            continue
        flat_k = keys[pass_plan.key_rotation].reshape(-1, kv_heads, dim)
        out, lse, _ = flash_attn_varlen_func(
            q_rot.reshape(-1, heads, dim),
            flat_k[layout.key_index],
            flat_v[layout.key_index],
            cu_seqlens_q=plan.flash_queries.cu_seqlens,
            cu_seqlens_k=layout.cu_seqlens_k,
            max_seqlen_q=plan.flash_queries.max_seqlen,
            max_seqlen_k=layout.max_seqlen_k,
            softmax_scale=scale,
            causal=True,  # bottom-right aligned: query m reaches key m - nearest
            window_size=(-1 if farthest is None else farthest - nearest, 0),
            return_attn_probs=True,
        )
        if lse.shape != (heads, out.shape[0]):
            raise RuntimeError(
                f"flash-attn returned log-sum-exp of shape {tuple(lse.shape)}; position methods need flash-attn >= 2.5"
            )
        out = out.to(merge_dtype).masked_fill(empty[..., None], 0.0)
        parts.append((out, lse.transpose(0, 1).to(merge_dtype).masked_fill(empty, -math.inf)))
    return _merge(parts)[0].view(batch, q_len, heads, dim).to(v.dtype)


@dataclass
class _FlashQueries:
    """Queries of all rows, document by document, as flash-attn's varlen layout."""

    cu_seqlens: torch.Tensor
    max_seqlen: int


@dataclass
class _FlashKeys:
    """One pass's keys: each document's keys but its last `nearest` ones, laid end to end."""

    cu_seqlens_k: torch.Tensor
    key_index: torch.Tensor
    """Flat index (row * Tk + key) of every kept key."""
    max_seqlen_k: int


@dataclass
class _Segments:
    """Documents of all rows laid end to end: flat index of each one's first key, key counts, queries."""

    starts: torch.Tensor
    k_lengths: torch.Tensor
    queries: _FlashQueries


def _flash_segments(document_ids: torch.Tensor, q_len: int) -> _Segments:
    starts, k_lengths, q_lengths = document_segments(document_ids, q_len)
    cu_q = torch.nn.functional.pad(q_lengths.cumsum(0), (1, 0)).to(torch.int32)
    return _Segments(starts, k_lengths, _FlashQueries(cu_q, int(q_lengths.max())))


def _cut_segments(segments: _Segments, nearest: int) -> _FlashKeys:
    """Each document's keys with its last `nearest` dropped: flash's bottom-right causal
    alignment then ends query m of the document at key m - nearest."""
    kept = (segments.k_lengths - nearest).clamp(min=0)
    total = int(kept.sum())
    first = torch.repeat_interleave(segments.starts, kept, output_size=total)
    before = torch.repeat_interleave(kept.cumsum(0) - kept, kept, output_size=total)
    key_index = first + torch.arange(total, device=kept.device) - before
    cu_k = torch.nn.functional.pad(kept.cumsum(0), (1, 0)).to(torch.int32)
    return _FlashKeys(cu_k, key_index, int(kept.max()))
