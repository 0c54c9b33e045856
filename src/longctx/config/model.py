"""Model configuration: the architecture fields, their validation and the presets.

    config = ModelConfig.from_preset("tiny", max_position=2048)
    config.num_parameters(), config.head_size, config.layer_specs()

This module imports no torch, so the config loader and `longctx config` can validate a
model without building one. Field names are the config keys under `model.`.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

from longctx.config.checks import above, boolean, choice, positive_int
from longctx.config.linear_attention import LinearAttention
from longctx.config.temperature import AttentionTemperature
from longctx.errors import ConfigError

ATTENTION_BACKENDS = ("auto", "sdpa", "varlen", "flex", "flash", "xformers")
"""Names accepted by `model.attention_backend` (see model/attention.py for each)."""

ROPE_SCALING_TYPES = ("none", "linear", "ntk", "yarn", "llama3", "longrope")

LAYER_TYPES = ("full", "sliding", "linear")
"""Values of `model.layer_types`: a layer attends every earlier key of its document (`full`),
only the last `model.sliding_window` of them, itself included (`sliding`), or none: a Gated
DeltaNet recurrence without positions (`linear`, config/linear_attention.py)."""

QK_NORMS = ("none", "head", "projection")
"""Values of `model.qk_norm`: no norm on q and k; an RMSNorm over each head's head_dim
(Qwen3, Gemma 3), shared by the heads; one RMSNorm over the whole q and k projections
before the split into heads (OLMo 2 and 3: weights of n_heads x head_dim and n_kv_heads x
head_dim)."""

PARTIAL_ROTARY = ("first", "p-rope")
"""Values of `model.partial_rotary`: which channels rotate when `rotary_fraction` p < 1.
`first`: transformers' `partial_rotary_factor`, the first p·D channels of each head rotate
(rotate-half within them) with frequencies computed over p·D (Phi-3/4, GPT-NeoX).
`p-rope`: Barbero et al. (ICLR 2025, "Round and Round We Go"), the full-D frequencies
with the slowest (1 - p) fraction of pairs left unrotated."""

NORM_PLACEMENTS = ("pre", "sandwich", "post")
"""Values of `model.norm_placement`: where each block's RMSNorms sit. `pre` (Llama): one norm
before each sublayer; `sandwich` (Gemma 2/3): one before and one after each sublayer's
output, before the residual add; `post` (OLMo 2/3): one after each sublayer's output only."""

MLP_ACTIVATIONS = ("silu", "gelu_tanh")
"""Values of `model.mlp_activation`: the gate's activation, down(act(gate(x)) * up(x)):
SwiGLU (`silu`, Llama) or GeGLU with the tanh approximation of GELU (`gelu_tanh`, Gemma's
`gelu_pytorch_tanh`)."""

ATTENTION_BIASES = ("none", "qkv", "qkvo")
"""Values of `model.attention_bias`: which attention projections carry a bias (Qwen2: qkv;
Llama's `attention_bias: true`: qkvo)."""

ATTENTION_GATES = ("none", "elementwise", "head")


@dataclass
class RopeScaling:
    """How RoPE frequencies are rescaled for a context longer than pretraining."""

    type: str = "none"
    """One of none | linear | ntk | yarn | llama3 | longrope."""
    factor: float = 1.0
    """Extension factor: target context / original context."""
    original_max_position: int = 0
    """Context length the base model was trained at (yarn, llama3, longrope). 0 = model.max_position."""
    beta_fast: float = 32.0
    """YaRN: rotations over the original context above which a dimension extrapolates."""
    beta_slow: float = 1.0
    """YaRN: rotations over the original context below which a dimension interpolates."""
    attention_factor: float = 0.0
    """YaRN, longrope: cos/sin multiplier. 0 = YaRN's 0.1 * ln(factor) + 1; longrope's
    sqrt(1 + ln(factor) / ln(original_max_position)) (1 for factor 1)."""
    low_freq_factor: float = 1.0
    """llama3: wavelengths above original_max_position / low_freq_factor are interpolated."""
    high_freq_factor: float = 4.0
    """llama3: wavelengths below original_max_position / high_freq_factor are kept."""
    short_factor: list[float] = field(default_factory=list)
    """longrope (Phi-3): theta_i / short_factor[i] in a forward whose positions all lie below
    original_max_position; long_factor[i] in one that reaches past it (model/rope.py)."""
    long_factor: list[float] = field(default_factory=list)


@dataclass
class ModelConfig:
    """Architecture of a Llama-style decoder. Field names are the config keys under `model.`."""

    preset: str = "debug"
    """Named starting point (see PRESETS); fields set next to it override the preset."""
    vocab_size: int = 8192
    """Embedding rows and output logits."""
    d_model: int = 64
    """Residual stream width."""
    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Query heads."""
    n_kv_heads: int = 2
    """Key/value heads (GQA); must divide n_heads."""
    head_dim: int = 0
    """Channels per head: q/o projections of n_heads x head_dim, k/v of n_kv_heads x head_dim.
    0 = d_model / n_heads; set it where a checkpoint decouples the two (Gemma 3 270M: width
    640, 4 heads of 256; Qwen3). `head_size` is the resolved value."""
    d_ff: int = 256
    """SwiGLU hidden width."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_base: float = 10000.0
    """RoPE base (theta); Llama 3 uses 500000."""
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    """Context-extension scaling of the RoPE frequencies."""
    rope_position_scale: float = 1.0
    """s: every RoPE frequency times s (equivalently position ids times s), applied after
    rope_scaling. s > 1 gives a window of L tokens the angles of an L * s window (more
    rotation per token: distance is harder to ignore); 1 = plain RoPE, bitwise. Above
    s ~ 3.14 the fastest pair (theta_0 = 1 rad per token) turns more than pi per token and
    aliases: an offset of 1 looks like one of 1 - 2 pi / s, so neighbouring tokens blur
    in that pair while the slow pairs still separate them (model/rope.py)."""
    max_position: int = 2048
    """Training context length (HF max_position_embeddings); yarn/llama3 scale relative to it."""
    attention_backend: str = "auto"
    """auto | sdpa | varlen | flex | flash | xformers (see model/attention.py)."""
    init_std: float = 0.02
    """Std of the normal initialisation of all linear and embedding weights."""
    tie_embeddings: bool = False
    """One shared [vocab, d_model] matrix for the input embedding and the output head (HF
    tie_word_embeddings: Llama-3.2-1B/3B, SmolLM2, small Qwen2.5)."""
    attention_bias: str = "none"
    """none | qkv | qkvo: the attention projections that carry a bias (see ATTENTION_BIASES)."""
    layer_types: list[str] | None = None
    """One of LAYER_TYPES per layer (`full` | `sliding`), the form of transformers'
    `layer_types`; None = every layer full, unless `global_every` is set."""
    global_every: int = 0
    """k > 0: every k-th layer (layers k-1, 2k-1, ...) is full, the others sliding (Gemma 3:
    6, five local layers to one global; OLMo 3: 4). Exclusive with `layer_types`."""
    sliding_window: int = 0
    """W: a sliding layer's query attends itself and the W - 1 keys before it in its document
    (transformers' `sliding_window`: key j is seen by query i iff 0 <= i - j < W). Needed
    when any layer slides; a window >= max_position is allowed and makes the layer full
    over the trained length (a warning says so)."""
    sliding_rope_base: float = 0.0
    """RoPE base of the sliding layers (Gemma 3: 10,000 local, 1,000,000 global);
    0 = rope_base. Full layers use rope_base and rope_scaling; sliding layers no scaling
    (as transformers' `rope_local_base_freq`)."""
    nope_layers: list[int] | None = None
    """Layers (0-based) that rotate nothing: NoPE (SmolLM3, Llama 4's iRoPE, Cohere's RNoPE).
    Careful with transformers' `no_rope_layers`, where 1 means the layer *uses* RoPE."""
    nope_every: int = 0
    """k > 0: every k-th layer (layers k-1, 2k-1, ...) is NoPE (SmolLM3:
    `no_rope_layer_interval` 4). Exclusive with `nope_layers`."""
    qk_norm: str = "none"
    """none | head | projection: an RMSNorm on q and k before RoPE (see QK_NORMS)."""
    rotary_fraction: float = 1.0
    """p in (0, 1]: the fraction of each head's channels that rotate (Phi-4-mini 0.75;
    p-RoPE 0.25); 1 = every channel. Which channels: `partial_rotary`."""
    partial_rotary: str = "first"
    """first | p-rope: how a fraction p < 1 of channels rotates (see PARTIAL_ROTARY)."""
    norm_placement: str = "pre"
    """pre | sandwich | post: where each block's norms sit (see NORM_PLACEMENTS)."""
    norm_offset: bool = False
    """Every RMSNorm multiplies by 1 + weight instead of weight (Gemma): the weights are kept
    as the checkpoint stores them and initialised to 0."""
    mlp_activation: str = "silu"
    """silu | gelu_tanh: the MLP gate's activation (see MLP_ACTIVATIONS)."""
    scale_embeddings: bool = False
    """The input embeddings times sqrt(d_model), that factor first rounded to the embedding
    dtype (Gemma; transformers' `embed_scale.to(weight.dtype)`)."""
    query_pre_attn_scalar: float = 0.0
    """s > 0: attention scores are q.k / sqrt(s) instead of q.k / sqrt(head_dim) (Gemma's
    `query_pre_attn_scalar`); 0 = head_dim."""
    attention_sinks: bool = False
    """gpt-oss's attention sinks: a learned logit s_h per query head (`attn.sinks`, [n_heads],
    every layer, initialised N(0, init_std) as transformers' gpt-oss) joins every softmax's
    denominator and contributes no value: out = out_attn * sigmoid(lse - s_h)."""
    attention_gate: str = "none"
    """none | elementwise | head: each attention layer's output times sigmoid(x W_g) before o_proj,
    W_g = `attn.wg` of n_heads x head_dim rows, one gate a channel (`elementwise`: Qwen3-Next,
    Qiu et al. 2025's G1 elementwise), or n_heads rows, one a head (`head`: G1 head-wise)."""
    attn_temperature: AttentionTemperature = field(default_factory=AttentionTemperature)
    """Queries times a per-position factor (Llama 4, Scalable-Softmax; see AttentionTemperature)."""
    linear_attention: LinearAttention = field(default_factory=LinearAttention)
    """The `linear` layers' Gated DeltaNet (config/linear_attention.py); unused without them."""

    def __post_init__(self) -> None:
        if isinstance(self.attn_temperature, dict):
            self.attn_temperature = AttentionTemperature(**self.attn_temperature)
        if isinstance(self.linear_attention, dict):
            self.linear_attention = LinearAttention(**self.linear_attention)
        self.validate()

    @property
    def head_size(self) -> int:
        """Channels per head: `head_dim`, or d_model / n_heads when it is 0."""
        return self.head_dim or self.d_model // self.n_heads

    def layer_kinds(self) -> list[str]:
        """`full`, `sliding` or `linear` for each layer."""
        if self.layer_types is not None:
            return list(self.layer_types)
        if every := self.linear_attention.full_every:
            return ["full" if (i + 1) % every == 0 else "linear" for i in range(self.n_layers)]
        if self.global_every:
            return ["full" if (i + 1) % self.global_every == 0 else "sliding" for i in range(self.n_layers)]
        return ["full"] * self.n_layers

    def nope_indices(self) -> set[int]:
        """The layers that rotate nothing."""
        if self.nope_layers is not None:
            return set(self.nope_layers)
        if self.nope_every:
            return {i for i in range(self.n_layers) if (i + 1) % self.nope_every == 0}
        return set()

    def layer_specs(self) -> list[LayerSpec]:
        """What each layer attends and how it rotates (docs/design.md §5)."""
        nope = self.nope_indices()
        specs = []
        for index, kind in enumerate(self.layer_kinds()):
            sliding = kind == "sliding"
            base = (self.sliding_rope_base or self.rope_base) if sliding else self.rope_base
            rope = index not in nope and kind != "linear"
            specs.append(LayerSpec(kind, self.sliding_window if sliding else 0, rope, base))
        return specs

    def block_norm_placement(self, layer: int) -> str:
        """Where layer `layer`'s block norms sit: `linear_attention.norm_placement` for a
        linear layer where it is set, else `norm_placement`."""
        if self.linear_attention.norm_placement and self.layer_kinds()[layer] == "linear":
            return self.linear_attention.norm_placement
        return self.norm_placement

    @property
    def linear_layout(self) -> tuple:
        """The linear layers and their shapes: (indices, variant, heads and sizes, conv size)."""
        linear = tuple(i for i, kind in enumerate(self.layer_kinds()) if kind == "linear")
        mixer = self.linear_attention
        return (linear, mixer.variant, mixer.heads(self.n_heads, self.head_size), mixer.conv_size) if linear else ()

    @property
    def is_hybrid(self) -> bool:
        """Any layer that slides or rotates nothing: the designs beyond one RoPE for all."""
        return any(spec != LayerSpec("full", 0, True, self.rope_base) for spec in self.layer_specs())

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ModelConfig:
        if name not in PRESETS:
            raise ConfigError("model.preset", f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        values = {**PRESETS[name], **overrides}
        if isinstance(values.get("rope_scaling"), dict):
            values["rope_scaling"] = RopeScaling(**values["rope_scaling"])
        return cls(preset=name, **values)

    def num_parameters(self) -> int:
        attn = self.d_model * self.head_size * (2 * self.n_heads + 2 * self.n_kv_heads)
        if self.attention_bias != "none":
            attn += self.head_size * (self.n_heads + 2 * self.n_kv_heads)
        if self.qk_norm == "head":
            attn += 2 * self.head_size
        elif self.qk_norm == "projection":
            attn += self.head_size * (self.n_heads + self.n_kv_heads)
        if self.attention_bias == "qkvo":
            attn += self.d_model
        gate = {"none": 0, "head": 1}.get(self.attention_gate, self.head_size)  # gate values a head
        attn += self.n_heads * (self.attention_sinks + gate * (self.d_model + (self.attention_bias != "none")))
        mlp = 3 * self.d_model * self.d_ff
        per_layer = attn + mlp
        norms = sum(4 if self.block_norm_placement(i) == "sandwich" else 2 for i in range(self.n_layers))
        embeddings = (1 if self.tie_embeddings else 2) * self.vocab_size * self.d_model
        linear = self.layer_kinds().count("linear")
        mixer = self.linear_attention.num_parameters(self.d_model, self.n_heads, self.head_size)
        blocks = self.n_layers * per_layer + norms * self.d_model
        return embeddings + blocks + linear * (mixer - attn) + self.d_model

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_position"):
            positive_int(f"model.{name}", getattr(self, name))
        if not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool) or self.head_dim < 0:
            raise ConfigError(
                "model.head_dim", f"must be a non-negative integer (0 = d_model / n_heads), got {self.head_dim!r}"
            )
        if self.head_dim and self.head_dim % 2:
            raise ConfigError("model.head_dim", f"{self.head_dim} must be even for RoPE")
        if not self.head_dim and self.d_model % self.n_heads:
            raise ConfigError(
                "model.d_model",
                f"{self.d_model} is not divisible by model.n_heads={self.n_heads} (or set model.head_dim)",
                ("model.n_heads",),
            )
        if not self.head_dim and self.head_size % 2:
            raise ConfigError(
                "model.d_model",
                f"head_dim = d_model / n_heads = {self.head_size} must be even for RoPE",
                ("model.n_heads",),
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                "model.n_kv_heads",
                f"{self.n_kv_heads} does not divide model.n_heads={self.n_heads}",
                ("model.n_heads",),
            )
        above("model.rope_base", self.rope_base, 1)
        if not isinstance(self.rope_position_scale, (int, float)) or not self.rope_position_scale > 0:
            raise ConfigError("model.rope_position_scale", f"must be > 0, got {self.rope_position_scale!r}")
        above("model.norm_eps", self.norm_eps, 0)
        boolean("model.tie_embeddings", self.tie_embeddings)
        choice("model.attention_bias", self.attention_bias, ATTENTION_BIASES)
        choice("model.attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        self._validate_designs()
        scaling = self.rope_scaling
        choice("model.rope_scaling.type", scaling.type, ROPE_SCALING_TYPES)
        if scaling.type != "none" and scaling.factor < 1:
            raise ConfigError(
                "model.rope_scaling.factor", f"must be >= 1 for {scaling.type} scaling, got {scaling.factor}"
            )
        if scaling.original_max_position < 0:
            raise ConfigError("model.rope_scaling.original_max_position", "must be >= 0 (0 = model.max_position)")
        if scaling.type == "llama3" and scaling.high_freq_factor <= scaling.low_freq_factor:
            raise ConfigError(
                "model.rope_scaling.high_freq_factor",
                f"{scaling.high_freq_factor} must exceed low_freq_factor={scaling.low_freq_factor}",
            )
        pairs = (int(self.rotary_fraction * self.head_size) if self.partial_rotary == "first" else self.head_size) // 2
        for name in ("short_factor", "long_factor"):
            values = getattr(scaling, name)
            if scaling.type == "longrope" and (len(values) != pairs or not all(v > 0 for v in values)):
                raise ConfigError(
                    f"model.rope_scaling.{name}", f"longrope needs {pairs} factors > 0 (one per rotated pair)"
                )
            if scaling.type != "longrope" and values:
                raise ConfigError(f"model.rope_scaling.{name}", f"is longrope's, not {scaling.type}'s")
        if scaling.type == "yarn" and scaling.beta_fast <= scaling.beta_slow:
            raise ConfigError(
                "model.rope_scaling.beta_fast", f"{scaling.beta_fast} must exceed beta_slow={scaling.beta_slow}"
            )

    def _validate_designs(self) -> None:
        """Layer types, window, NoPE layers, qk-norm and partial rotation."""
        if self.layer_types is not None and self.global_every:
            raise ConfigError("model.global_every", "set model.layer_types or model.global_every, not both")
        self.linear_attention.validate()
        if self.linear_attention.full_every and (self.layer_types is not None or self.global_every):
            raise ConfigError("model.linear_attention.full_every", "set it or layer_types / global_every, not both")
        if self.layer_types is not None:
            if len(self.layer_types) != self.n_layers:
                raise ConfigError(
                    "model.layer_types",
                    f"has {len(self.layer_types)} entries, model.n_layers is {self.n_layers}",
                    ("model.n_layers",),
                )
            for index, kind in enumerate(self.layer_types):
                if kind not in LAYER_TYPES:
                    raise ConfigError("model.layer_types", f"entry {index} is {kind!r}, not one of {LAYER_TYPES}")
        if not isinstance(self.global_every, int) or self.global_every < 0:
            raise ConfigError("model.global_every", f"must be a non-negative integer, got {self.global_every!r}")
        if not isinstance(self.sliding_window, int) or self.sliding_window < 0:
            raise ConfigError("model.sliding_window", f"must be a positive integer, got {self.sliding_window!r}")
        if "linear" in self.layer_kinds():
            self.linear_attention.check_heads(self.n_heads, self.head_size)
        if "sliding" in self.layer_kinds():
            if self.sliding_window <= 0:
                raise ConfigError(
                    "model.sliding_window", "must be > 0: some layers slide (model.layer_types / global_every)"
                )
            if self.sliding_window >= self.max_position:
                warnings.warn(
                    f"model.sliding_window={self.sliding_window} >= model.max_position={self.max_position}: "
                    "the sliding layers see their whole document up to the trained length (full layers there)",
                    stacklevel=2,
                )
        if self.sliding_rope_base and self.sliding_rope_base <= 1:
            raise ConfigError(
                "model.sliding_rope_base", f"must be > 1 (or 0 = model.rope_base), got {self.sliding_rope_base}"
            )
        if self.nope_layers is not None and self.nope_every:
            raise ConfigError("model.nope_every", "set model.nope_layers or model.nope_every, not both")
        for index in self.nope_layers or ():
            if not isinstance(index, int) or not 0 <= index < self.n_layers:
                raise ConfigError(
                    "model.nope_layers", f"layer {index!r} is not in [0, {self.n_layers})", ("model.n_layers",)
                )
        if not isinstance(self.nope_every, int) or self.nope_every < 0:
            raise ConfigError("model.nope_every", f"must be a non-negative integer, got {self.nope_every!r}")
        for name, allowed in (
            ("qk_norm", QK_NORMS),
            ("partial_rotary", PARTIAL_ROTARY),
            ("norm_placement", NORM_PLACEMENTS),
            ("mlp_activation", MLP_ACTIVATIONS),
            ("attention_gate", ATTENTION_GATES),
        ):
            choice(f"model.{name}", getattr(self, name), allowed)
        if not isinstance(self.rotary_fraction, (int, float)) or not 0 < self.rotary_fraction <= 1:
            raise ConfigError("model.rotary_fraction", f"must be in (0, 1], got {self.rotary_fraction!r}")
        self.attn_temperature.validate()
        rotated = self.rotary_fraction * self.head_size
        if self.partial_rotary == "first" and (rotated != int(rotated) or int(rotated) % 2):
            raise ConfigError(
                "model.rotary_fraction",
                f"{self.rotary_fraction} x head_dim {self.head_size} = {rotated:g} channels: must be an even integer",
            )
        for name in ("norm_offset", "scale_embeddings", "attention_sinks"):
            boolean(f"model.{name}", getattr(self, name))
        scalar = self.query_pre_attn_scalar
        if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or scalar < 0:
            raise ConfigError("model.query_pre_attn_scalar", f"must be >= 0 (0 = head_dim), got {scalar!r}")


@dataclass(frozen=True)
class LayerSpec:
    """One layer's attention design, resolved from the config (ModelConfig.layer_specs)."""

    kind: str
    """`full`, `sliding` or `linear` (no positions: `rope` False, `window` 0)."""
    window: int
    """W for a sliding layer (query i sees keys i - W < j <= i); 0 for a full one."""
    rope: bool
    """False: a NoPE layer, nothing rotates."""
    rope_base: float
    """Its RoPE base (sliding layers: sliding_rope_base when set)."""


PRESETS: dict[str, dict] = {
    # TinyLlama 1.1B (Zhang et al., 2024): Llama-2 tokenizer.
    "tinyllama-1.1b": dict(
        vocab_size=32000, d_model=2048, n_layers=22, n_heads=32, n_kv_heads=4, d_ff=5632, max_position=2048
    ),
    # STRING paper's 1.3B pretraining runs (Appendix A.2): TinyLlama body, Llama 3 tokenizer.
    "string-1.3b": dict(
        vocab_size=128256, d_model=2048, n_layers=22, n_heads=32, n_kv_heads=4, d_ff=5632, max_position=2048
    ),
    # CPU experiments: minutes per thousand steps at T=1024 on two cores.
    "tiny": dict(vocab_size=8192, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, d_ff=1024, max_position=1024),
    # Unit tests.
    "debug": dict(vocab_size=8192, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=256, max_position=512),
}


SHAPE_FIELDS = (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_size",
    "d_ff",
    "qk_norm",
    "norm_placement",
    "tie_embeddings",
    "attention_bias",
    "attention_sinks",
    "attention_gate",
    "linear_layout",
)
"""ModelConfig fields that fix the parameters and their shapes. Weights move between configs
that agree on these (continued pretraining at a longer window, a new RoPE base, model merging)."""


def shape_mismatches(config: ModelConfig, other: ModelConfig) -> list[str]:
    """'field: a vs b' for every shape-defining field on which the two configs differ."""
    return [
        f"{field}: {getattr(config, field)} vs {getattr(other, field)}"
        for field in SHAPE_FIELDS
        if getattr(config, field) != getattr(other, field)
    ]


def config_dict(config: ModelConfig) -> dict:
    """A plain dict of the config (safe for JSON, YAML and weights-only checkpoints)."""
    return dataclasses.asdict(config)
