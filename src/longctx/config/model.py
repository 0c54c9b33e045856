"""Model configuration: the architecture fields, their validation and the presets.

    config = ModelConfig.from_preset("tiny", max_position=2048)
    config.num_parameters(), config.head_dim

This module imports no torch, so the config loader and `longctx config` can validate a
model without building one. Field names are the config keys under `model.`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from longctx.errors import ConfigError

ATTENTION_BACKENDS = ("auto", "sdpa", "varlen", "flex", "flash", "xformers")
"""Names accepted by `model.attention_backend` (see model/attention.py for each)."""

ROPE_SCALING_TYPES = ("none", "linear", "ntk", "yarn", "llama3")

ATTENTION_BIASES = ("none", "qkv", "qkvo")
"""Values of `model.attention_bias`: which attention projections carry a bias (Qwen2: qkv;
Llama's `attention_bias: true`: qkvo)."""


@dataclass
class RopeScaling:
    """How RoPE frequencies are rescaled for a context longer than pretraining."""

    type: str = "none"
    """One of none | linear | ntk | yarn | llama3."""
    factor: float = 1.0
    """Extension factor: target context / original context."""
    original_max_position: int = 0
    """Context length the base model was trained at (yarn, llama3). 0 = model.max_position."""
    beta_fast: float = 32.0
    """YaRN: rotations over the original context above which a dimension extrapolates."""
    beta_slow: float = 1.0
    """YaRN: rotations over the original context below which a dimension interpolates."""
    attention_factor: float = 0.0
    """YaRN: cos/sin multiplier. 0 = the paper's 0.1 * ln(factor) + 1."""
    low_freq_factor: float = 1.0
    """llama3: wavelengths above original_max_position / low_freq_factor are interpolated."""
    high_freq_factor: float = 4.0
    """llama3: wavelengths below original_max_position / high_freq_factor are kept."""


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
    """Query heads; head_dim = d_model / n_heads."""
    n_kv_heads: int = 2
    """Key/value heads (GQA); must divide n_heads."""
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

    def __post_init__(self) -> None:
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ModelConfig:
        if name not in PRESETS:
            raise ConfigError("model.preset", f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        values = {**PRESETS[name], **overrides}
        if isinstance(values.get("rope_scaling"), dict):
            values["rope_scaling"] = RopeScaling(**values["rope_scaling"])
        return cls(preset=name, **values)

    def num_parameters(self) -> int:
        attn = self.d_model * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        if self.attention_bias != "none":
            attn += self.head_dim * (self.n_heads + 2 * self.n_kv_heads)
        if self.attention_bias == "qkvo":
            attn += self.d_model
        mlp = 3 * self.d_model * self.d_ff
        per_layer = attn + mlp + 2 * self.d_model
        embeddings = (1 if self.tie_embeddings else 2) * self.vocab_size * self.d_model
        return embeddings + self.n_layers * per_layer + self.d_model

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_position"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{name}", f"must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                "model.d_model", f"{self.d_model} is not divisible by model.n_heads={self.n_heads}", ("model.n_heads",)
            )
        if self.head_dim % 2:
            raise ConfigError(
                "model.d_model",
                f"head_dim = d_model / n_heads = {self.head_dim} must be even for RoPE",
                ("model.n_heads",),
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                "model.n_kv_heads",
                f"{self.n_kv_heads} does not divide model.n_heads={self.n_heads}",
                ("model.n_heads",),
            )
        if self.rope_base <= 1:
            raise ConfigError("model.rope_base", f"must be > 1, got {self.rope_base}")
        if not isinstance(self.rope_position_scale, (int, float)) or not self.rope_position_scale > 0:
            raise ConfigError("model.rope_position_scale", f"must be > 0, got {self.rope_position_scale!r}")
        if self.norm_eps <= 0:
            raise ConfigError("model.norm_eps", f"must be > 0, got {self.norm_eps}")
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError("model.tie_embeddings", f"must be true or false, got {self.tie_embeddings!r}")
        if self.attention_bias not in ATTENTION_BIASES:
            raise ConfigError("model.attention_bias", f"{self.attention_bias!r} is not one of {ATTENTION_BIASES}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(
                "model.attention_backend", f"{self.attention_backend!r} is not one of {ATTENTION_BACKENDS}"
            )
        scaling = self.rope_scaling
        if scaling.type not in ROPE_SCALING_TYPES:
            raise ConfigError("model.rope_scaling.type", f"{scaling.type!r} is not one of {ROPE_SCALING_TYPES}")
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
        if scaling.type == "yarn" and scaling.beta_fast <= scaling.beta_slow:
            raise ConfigError(
                "model.rope_scaling.beta_fast", f"{scaling.beta_fast} must exceed beta_slow={scaling.beta_slow}"
            )


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
    "d_ff",
    "tie_embeddings",
    "attention_bias",
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
