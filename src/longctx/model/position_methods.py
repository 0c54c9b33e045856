"""Evaluation-time position methods: StRing and the training-free baselines (DESIGN §8).

Every method here rewrites the relative position P[m][n] = m - n that RoPE sees between a
query at position m and a key at position n (positions within a document), without
training. Each is a list of passes (attention_passes.py: a pass covers a range of key
distances per query and rotates queries and keys at its own RoPE indices; the passes'
softmaxes are merged with their log-sum-exps in fp32, STRING Algorithm 2).

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

Implementations (attention_passes.py): pure torch on any device (the CPU default; torch's
fused CPU flash kernel per document and band) and flash-attn on CUDA for methods whose
passes are fixed distance bands (string, rerope, self_extend); rope/ntk/yarn call
`attention()` with the chosen backend.

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

import torch
from torch import nn

from longctx.model.attention import DEFAULT_BLOCK_SIZE, attention
from longctx.model.attention_passes import (
    UNBOUNDED,
    AttentionPass,
    PositionPlan,
    attend_passes,
    band_pass,
    check_inputs,
    cos_sin,
    make_plan,
)
from longctx.errors import ConfigError
from longctx.model.config import ModelConfig
from longctx.model.rope import RopeScaling, RotaryEmbedding, apply_rotary, rotate_half

POSITION_METHODS = ("rope", "ntk", "yarn", "rerope", "self_extend", "dca", "string")
BASELINE_TRAINING_FRACTION = 2 / 3
"""STRING §4.2: baselines pretend the model was trained at 2/3 of its training length."""
STRING_COMPAT = ("paper", "repo")
REPO_STRING_ATTENTION_FACTOR = 1 + 0.1 * math.log(2)
"""cos/sin multiplier of the authors' released StRing code (compat='repo')."""


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


# --- methods -------------------------------------------------------------------------


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
        at its own positions (from `rotate_keys`). dtype: the dtype of q/k.
        """
        return make_plan(self, position_ids, document_ids, q_len, keys_rotated, backend, block_size, dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PositionPlan, scale: float | None = None):
        """Attention output [B, Tq, H, D] from un-rotated q (and k unless the plan says rotated)."""
        check_inputs(q, k, v, plan)
        scale = (q.shape[-1] ** -0.5 if scale is None else scale) * self.score_multiplier
        if plan.query_scale is not None:
            q = q * plan.query_scale[:, :, None, None]
        if plan.mask is not None:
            only = plan.passes[0]
            keys = k if plan.keys_rotated else apply_rotary(k, *plan.key_rotations[0])
            return attention(apply_rotary(q, only.query_cos, only.query_sin), keys, v, mask=plan.mask, scale=scale)
        swapped = rotate_half(q)  # shared by every pass's rotation
        queries = [torch.addcmul(q * p.query_cos[:, :, None], swapped, p.query_sin[:, :, None]) for p in plan.passes]
        return attend_passes(queries, k, v, plan, scale)

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
