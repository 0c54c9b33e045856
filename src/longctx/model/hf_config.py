"""config.json <-> ModelConfig for the Llama-family HF architectures longctx can represent.

Import reads `model_type` llama, mistral (without an effective sliding window) and qwen2
(q/k/v biases, without sliding-window layers); every field that would make the logits
differ (another activation, MLP biases, a sliding window, DeepSeek's YaRN mscale, ...) is
refused with the field named, since the weights would load and the outputs silently
differ. Export writes `llama`, or `qwen2` for q/k/v-only biases (Llama's `attention_bias`
puts a bias on o_proj too), with `tie_word_embeddings` as the model has it.

RoPE scaling is written in the `rope_theta` + `rope_scaling` form that transformers 4.x,
5.x and vLLM all read. HF has no static NTK-aware type; NTK scaling *is* a larger base
(base * factor^(d/(d-2))), so it is exported as that `rope_theta`, exact for any reader.
The original settings are kept under `longctx_rope_scaling` so import restores them.
"""

from __future__ import annotations

import dataclasses
import json

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.rope import RopeScaling

CONFIG_FILE = "config.json"
MODEL_TYPES = ("llama", "mistral", "qwen2")

UNSUPPORTED = {
    "mlp_bias": "biases in the MLP projections",
}
"""config.json fields that must be false: longctx's SwiGLU has no biases."""


def hf_config(config: ModelConfig) -> dict:
    """The config.json of `config`: a LlamaForCausalLM, or a Qwen2ForCausalLM for q/k/v biases.
    `head_dim` is written always (transformers' Llama reads a decoupled one)."""
    if config.is_hybrid:
        raise CheckpointError(
            "export-hf writes Llama and Qwen2 models, whose every layer is full and rotates: this model has "
            "sliding or NoPE layers (model.layer_types / global_every / nope_layers / nope_every)"
        )
    for key, value, plain in (
        ("qk_norm", config.qk_norm, "none"),
        ("rotary_fraction", config.rotary_fraction, 1),
        ("attention_sinks", config.attention_sinks, False),
        ("attn_temperature.type", config.attn_temperature.type, "none"),
    ):
        if value != plain:
            raise CheckpointError(
                f"cannot export model.{key}={value!r}: the Llama/Qwen2 config.json has no such field "
                "(evaluate the checkpoint with longctx itself)"
            )
    rope_theta, rope_scaling = _scaling_to_hf(config)
    qwen2 = config.attention_bias == "qkv"
    values = {
        "architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen2 else "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_size,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": config.init_std,
        "torch_dtype": "float32",
        "longctx_preset": config.preset,
        "longctx_rope_base": config.rope_base,
        "longctx_rope_scaling": dataclasses.asdict(config.rope_scaling),
    }
    if qwen2:
        values.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.n_layers)
    else:
        values.update(attention_bias=config.attention_bias == "qkvo", mlp_bias=False)
    return values


def _scaling_to_hf(config: ModelConfig) -> tuple[float, dict | None]:
    if config.rope_position_scale != 1.0:
        raise CheckpointError(
            f"cannot export model.rope_position_scale={config.rope_position_scale}: config.json has no such field"
        )
    scaling = config.rope_scaling
    original = scaling.original_max_position or config.max_position
    if scaling.type == "none":
        return config.rope_base, None
    if scaling.type == "ntk":
        return config.rope_base * scaling.factor ** (config.head_size / (config.head_size - 2)), None
    if scaling.type == "linear":
        return config.rope_base, {"rope_type": "linear", "factor": scaling.factor}
    if scaling.type == "yarn":
        yarn: dict = {
            "rope_type": "yarn",
            "factor": scaling.factor,
            "original_max_position_embeddings": original,
            "beta_fast": scaling.beta_fast,
            "beta_slow": scaling.beta_slow,
        }
        if scaling.attention_factor > 0:
            yarn["attention_factor"] = scaling.attention_factor
        return config.rope_base, yarn
    if scaling.type == "llama3":
        return config.rope_base, {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": original,
        }
    raise CheckpointError(f"cannot export rope scaling type {scaling.type!r}")


def model_config_from_hf(hf: dict, source: str = CONFIG_FILE) -> ModelConfig:
    """Map an HF config.json dict (llama, mistral, qwen2) to a ModelConfig, refusing what
    the model cannot represent, with the field named."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"{source}: model_type is {model_type!r}, expected one of {MODEL_TYPES}")
    for field, meaning in UNSUPPORTED.items():
        if hf.get(field):
            raise CheckpointError(
                f"{source}: {field}={json.dumps(hf[field])} is not supported (longctx models have no {meaning})"
            )
    _refuse_sliding_window(hf, source)
    _check_special_ids(hf, source)
    activation = hf.get("hidden_act", "silu")
    if activation not in ("silu", "swish"):
        raise CheckpointError(
            f"{source}: hidden_act={activation!r} is not supported (longctx models use SwiGLU with silu)"
        )
    if hf.get("pretraining_tp", 1) != 1:
        raise CheckpointError(f"{source}: pretraining_tp={hf['pretraining_tp']} is not supported (only 1)")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if head_dim % 2:
        raise CheckpointError(f"{source}: head_dim={head_dim} is not supported: RoPE needs an even head_dim")
    if "longctx_rope_scaling" in hf:
        base = hf["longctx_rope_base"]
        scaling = RopeScaling(**hf["longctx_rope_scaling"])
    else:
        base = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
        scaling = _scaling_from_hf(hf.get(field), f"{source}: {field}")
    attention_bias = "qkv" if model_type == "qwen2" else "qkvo" if hf.get("attention_bias") else "none"
    return ModelConfig(
        preset=hf.get("longctx_preset", "debug"),
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=0 if head_dim * hf["num_attention_heads"] == hf["hidden_size"] else head_dim,
        d_ff=hf["intermediate_size"],
        norm_eps=hf.get("rms_norm_eps", 1e-5),
        rope_base=float(base),
        rope_scaling=scaling,
        max_position=hf.get("max_position_embeddings", 2048),
        init_std=hf.get("initializer_range", 0.02),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=attention_bias,
    )


def _refuse_sliding_window(hf: dict, source: str) -> None:
    """Sliding-window attention changes which keys a query sees; a window at least the
    context (or none) is full attention, which is what longctx computes."""
    if hf.get("use_sliding_window"):
        raise CheckpointError(f"{source}: use_sliding_window=true is not supported (full attention only)")
    sliding = [i for i, kind in enumerate(hf.get("layer_types") or []) if kind != "full_attention"]
    if sliding:
        raise CheckpointError(
            f"{source}: layer_types[{sliding[0]}]={hf['layer_types'][sliding[0]]!r} is not supported "
            "(full attention only)"
        )
    window = hf.get("sliding_window")
    context = hf.get("max_position_embeddings", 2048)
    if hf.get("model_type") == "mistral" and window is not None and window < context:
        raise CheckpointError(
            f"{source}: sliding_window={window} is not supported: smaller than max_position_embeddings={context} "
            "(longctx attends to the whole context; Mistral checkpoints from v0.2 on set it to null)"
        )


def _check_special_ids(hf: dict, source: str) -> None:
    """bos/eos/pad ids are an int, null, or (eos: Llama 3.x, Qwen2.5) a list of ints."""
    for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = hf.get(field)
        ids = value if isinstance(value, list) and field == "eos_token_id" else [value]
        if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise CheckpointError(f"{source}: {field}={json.dumps(value)} is not a token id or a list of them")


def _scaling_from_hf(rope: dict | None, where: str) -> RopeScaling:
    rope = rope or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return RopeScaling()
    for key in ("mscale", "mscale_all_dim"):  # DeepSeek's YaRN variant
        if rope.get(key):
            raise CheckpointError(f"{where}.{key}={rope[key]} is not supported (YaRN without mscale only)")
    original = rope.get("original_max_position_embeddings", 0)
    if kind == "linear":
        return RopeScaling("linear", factor=rope["factor"])
    if kind == "yarn":
        return RopeScaling(
            "yarn",
            factor=rope["factor"],
            original_max_position=original,
            beta_fast=rope.get("beta_fast") or 32.0,
            beta_slow=rope.get("beta_slow") or 1.0,
            attention_factor=rope.get("attention_factor") or 0.0,
        )
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            factor=rope["factor"],
            original_max_position=original,
            low_freq_factor=rope["low_freq_factor"],
            high_freq_factor=rope["high_freq_factor"],
        )
    raise CheckpointError(f"{where}.rope_type={kind!r} is not supported (default, linear, yarn, llama3)")
