"""What every family module shares: the `Family` record, the config.json fields common to the
Llama-like decoders, RoPE in transformers 4.x (`rope_theta` + `rope_scaling`) and 5.x
(`rope_parameters`) form, the layer types, and the weight names they share.

A family module reads a config.json dict into a `ModelConfig` and refuses, naming the field,
whatever would load and then compute other logits; the weights then load by its name map.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.rope import RopeScaling

if TYPE_CHECKING:
    from longctx.model.families.stored import StoredForm

LLAMA_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "attn.wq.bias": "self_attn.q_proj.bias",
    "attn.wk.bias": "self_attn.k_proj.bias",
    "attn.wv.bias": "self_attn.v_proj.bias",
    "attn.wo.bias": "self_attn.o_proj.bias",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}
"""Our per-layer name (after `blocks.{i}.`) -> the HF name (after `model.layers.{i}.`):
Llama, Mistral, Qwen2/3, SmolLM3 (pre-norm blocks)."""


class Rows(NamedTuple):
    """Where one of our tensors lies in a fused HF tensor: the HF tensor is `groups` equal
    blocks of rows (one per head for Qwen3-Next's doubled q_proj, one for Phi-3's qkv_proj),
    ours is rows [start, stop) of every block, the blocks stacked in order."""

    start: int
    stop: int
    groups: int = 1


TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@dataclass(frozen=True)
class Family:
    """One HF `model_type`: how its config.json maps onto ModelConfig, its weight names, what
    is refused and why, and (where longctx writes it) its config.json for export."""

    model_type: str
    architecture: str
    """The transformers class (`architectures` in config.json)."""
    read: Callable[[dict, str], ModelConfig]
    """config.json dict, its path for messages -> ModelConfig; raises CheckpointError naming a field."""
    layer_names: dict[str, str] = field(default_factory=lambda: dict(LLAMA_LAYER_NAMES))
    refused: tuple[str, ...] = ()
    """One line per refusal (field: why), for the docs and `longctx` messages."""
    write: Callable[[ModelConfig], dict] | None = None
    """ModelConfig -> config.json values for export (refusing what it cannot carry); None: not written."""
    fused: Callable[[str, ModelConfig], tuple[int, ...] | None] | None = None
    """Where layer_names maps several of ours onto one HF tensor (Phi-3's qkv_proj,
    gate_up_proj; Qwen3-Next's q_proj of query and gate rows per head): our per-layer name,
    config -> its `Rows` (start, stop[, groups]) of that tensor."""
    stored: StoredForm | None = None
    """Where the files store tensors under other names than transformers' modules (renamed,
    split) or norms without their offset (families/stored.py); None: as the modules name them."""

    linear_names: dict[str, str] = field(default_factory=dict)
    """Per-layer names of the `linear` layers where they differ from `layer_names` (OLMo
    Hybrid's and Qwen3-Next's `linear_attn.*`, and their own norm names)."""

    def hf_name(self, name: str, config: ModelConfig | None = None) -> str:
        """Our parameter name -> this family's HF name (`config`: which layers are linear)."""
        if name in TOP_NAMES:
            return TOP_NAMES[name]
        _, layer, rest = name.split(".", 2)  # blocks.{i}.rest
        linear = config is not None and self.linear_names and config.layer_kinds()[int(layer)] == "linear"
        return f"model.layers.{layer}.{(self.linear_names if linear else self.layer_names)[rest]}"

    def rows(self, name: str, config: ModelConfig) -> Rows | None:
        """Our tensor's `Rows` of its HF tensor when that tensor is fused, else None."""
        if self.fused is None or name in TOP_NAMES:
            return None
        part = self.fused(name.split(".", 2)[2], config)
        return None if part is None else Rows(*part)


def refuse_true(hf: dict, source: str, fields: dict[str, str]) -> None:
    """Each field of `fields` (name -> what longctx lacks) must be false, null or absent."""
    for name, meaning in fields.items():
        if hf.get(name):
            raise CheckpointError(f"{source}: {name}={json.dumps(hf[name])} is not supported ({meaning})")


def common_fields(
    hf: dict, source: str, activations: tuple[str, ...] = ("silu", "swish"), bias_flag: bool = True
) -> dict:
    """ModelConfig fields every family reads the same way (sizes, norm eps, RoPE of the full
    layers, tying), after the checks they share (special ids, activation, head_dim).
    `bias_flag`: the family's config has transformers' `attention_bias` flag, which biases all
    of q, k, v and o, so it is read; without one (Qwen2, biased on q/k/v always, and Phi-3,
    never biased) `attention_bias` is "none" here, whatever a file says, for the family to set."""
    check_special_ids(hf, source)
    key = "hidden_activation" if "hidden_activation" in hf else "hidden_act"
    activation = hf.get(key, activations[0])
    if activation not in activations:
        raise CheckpointError(
            f"{source}: {key}={activation!r} is not supported (this family's longctx MLP uses {activations[0]})"
        )
    if hf.get("pretraining_tp", 1) != 1:
        raise CheckpointError(f"{source}: pretraining_tp={hf['pretraining_tp']} is not supported (only 1)")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if head_dim % 2:
        raise CheckpointError(f"{source}: head_dim={head_dim} is not supported: RoPE needs an even head_dim")
    base, scaling = rope_from_hf(hf, source)
    return dict(
        preset=hf.get("longctx_preset", "debug"),
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=0 if head_dim * hf["num_attention_heads"] == hf["hidden_size"] else head_dim,
        d_ff=hf["intermediate_size"],
        norm_eps=hf.get("rms_norm_eps", 1e-5),
        rope_base=base,
        rope_scaling=scaling,
        max_position=hf.get("max_position_embeddings", 2048),
        init_std=hf.get("initializer_range", 0.02),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias="qkvo" if bias_flag and hf.get("attention_bias") else "none",
    )


def rope_from_hf(hf: dict, source: str, layer_type: str | None = None) -> tuple[float, RopeScaling]:
    """(base, scaling) of the full layers, or of `layer_type`'s entry where `rope_parameters`
    is keyed by layer type (Gemma 3 in transformers 5)."""
    if "longctx_rope_scaling" in hf and layer_type in (None, "full_attention"):  # longctx's own, full layers
        return float(hf["longctx_rope_base"]), RopeScaling(**hf["longctx_rope_scaling"])
    parameters = hf.get("rope_parameters") or {}
    if layer_type is not None and layer_type in parameters:
        entry = parameters[layer_type] or {}
        return float(entry.get("rope_theta", 10000.0)), scaling_from_hf(
            entry, f"{source}: rope_parameters.{layer_type}"
        )
    base = hf.get("rope_theta") or parameters.get("rope_theta", 10000.0)
    key = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    return float(base), scaling_from_hf(hf.get(key), f"{source}: {key}")


def layer_type_rope(hf: dict, source: str, fields: dict) -> float | None:
    """transformers 5's `rope_parameters` keyed by layer type {full_attention,
    sliding_attention} (Gemma 3, OLMo 3): the full layers' RoPE set into `fields`, the
    sliding layers' base returned (a scaled one refused: longctx's sliding layers rotate
    unscaled); None where `rope_parameters` is not keyed by layer type (transformers 4.x)."""
    parameters = hf.get("rope_parameters") or {}
    if "full_attention" not in parameters and "sliding_attention" not in parameters:
        return None
    for layer_type in ("full_attention", "sliding_attention"):
        if not parameters.get(layer_type):
            raise CheckpointError(f"{source}: rope_parameters has no {layer_type!r} entry")
    fields["rope_base"], fields["rope_scaling"] = rope_from_hf(hf, source, "full_attention")
    local_base, local_scaling = rope_from_hf(hf, source, "sliding_attention")
    if local_scaling.type != "none":
        raise CheckpointError(
            f"{source}: rope_parameters.sliding_attention.rope_type={local_scaling.type!r} is not supported "
            "(longctx's sliding layers rotate unscaled)"
        )
    return local_base


def layer_types_from_hf(hf: dict, source: str, switch: str | None = None) -> dict:
    """ModelConfig's `layer_types` + `sliding_window` from transformers' `layer_types` (or,
    for Qwen2/3 without it, layers >= `max_window_layers` slide when `switch` is on). A
    sliding layer without a window in force (`switch` false, `sliding_window` null) is
    refused; all full -> {} (today's model)."""
    n_layers = hf["num_hidden_layers"]
    enabled = bool(hf.get(switch)) if switch else True
    window = hf.get("sliding_window") if enabled else None
    types = hf.get("layer_types")
    if types is None:
        start = hf.get("max_window_layers", 0) if switch and window else n_layers
        types = ["sliding_attention" if i >= start else "full_attention" for i in range(n_layers)]
    if len(types) != n_layers:
        raise CheckpointError(f"{source}: layer_types has {len(types)} entries, num_hidden_layers is {n_layers}")
    for index, kind in enumerate(types):
        if kind not in ("full_attention", "sliding_attention"):
            raise CheckpointError(f"{source}: layer_types[{index}]={kind!r} is not supported (full or sliding)")
    if "sliding_attention" not in types:
        return {}
    if not window:
        index = types.index("sliding_attention")
        why = f"{switch}=false" if switch and not enabled else "sliding_window=null"
        raise CheckpointError(f"{source}: layer_types[{index}]='sliding_attention' with {why}: no window in force")
    kinds = ["sliding" if kind == "sliding_attention" else "full" for kind in types]
    return dict(layer_types=kinds, sliding_window=int(window))


def check_special_ids(hf: dict, source: str) -> None:
    """bos/eos/pad ids are an int, null, or (eos: Llama 3.x, Qwen2.5) a list of ints."""
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = hf.get(name)
        ids = value if isinstance(value, list) and name == "eos_token_id" else [value]
        if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise CheckpointError(f"{source}: {name}={json.dumps(value)} is not a token id or a list of them")


def scaling_from_hf(rope: dict | None, where: str) -> RopeScaling:
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


def refuse_fields(config: ModelConfig, architecture: str, plain: dict[str, object]) -> None:
    """Export: each ModelConfig field of `plain` must have that value (the family's config.json
    has no field for another)."""
    for key, value in plain.items():
        if getattr(config, key) != value:
            raise CheckpointError(
                f"cannot export model.{key}={getattr(config, key)!r}: the {architecture} config.json has no such "
                "field (evaluate the checkpoint with longctx itself)"
            )


def refuse_hybrid(config: ModelConfig, family: str) -> None:
    """Export: a family whose every layer is full and rotates cannot carry sliding or NoPE layers."""
    if config.is_hybrid:
        raise CheckpointError(
            f"cannot export a model with sliding or NoPE layers as {family} (model.layer_types / global_every / "
            "nope_layers / nope_every): evaluate the checkpoint with longctx itself"
        )


NO_SPECIAL_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
"""Export: ids left unset where the config class's defaults are its own tokenizer's (export_hf
writes the run's)."""


def common_hf_config(
    config: ModelConfig, family: str, architecture: str, omit: tuple[str, ...] = (), bias_flag: bool = True
) -> dict:
    """The config.json values every written family shares (`head_dim` always: every reader
    takes a decoupled one), less the keys in `omit` (those a family writes in its own form).
    `bias_flag`: the family's config has transformers' `attention_bias` flag, which biases all
    of q, k, v and o, so the flag is written and a q/k/v-only bias refused (Qwen2, biased on
    q/k/v always, and Phi-3, never biased, have no flag)."""
    if bias_flag and config.attention_bias == "qkv":
        raise CheckpointError(f"cannot export model.attention_bias='qkv' as {family}: its attention_bias is q/k/v/o")
    rope_theta, rope_scaling = scaling_to_hf(config)
    values = {
        "architectures": [architecture],
        "model_type": family,
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
    if bias_flag:
        values["attention_bias"] = config.attention_bias == "qkvo"
    return {key: value for key, value in values.items() if key not in omit}


def rope_parameters_to_hf(config: ModelConfig) -> dict:
    """The full layers' RoPE as transformers 5's `rope_parameters` (one entry of them)."""
    theta, scaling = scaling_to_hf(config)
    return {"rope_type": "default", **(scaling or {}), "rope_theta": theta}


def layer_types_to_hf(config: ModelConfig) -> dict:
    """`layer_types` with the window and RoPE per layer type (full: rope_base + scaling;
    sliding: sliding_rope_base, unscaled), as Gemma 3 and OLMo 3 write them."""
    return {
        "layer_types": [f"{kind}_attention" for kind in config.layer_kinds()],
        "sliding_window": config.sliding_window or config.max_position,
        "rope_parameters": {
            "full_attention": rope_parameters_to_hf(config),
            "sliding_attention": {"rope_type": "default", "rope_theta": config.sliding_rope_base or config.rope_base},
        },
    }


def scaling_to_hf(config: ModelConfig) -> tuple[float, dict | None]:
    """RoPE as `rope_theta` + `rope_scaling` (transformers 4.x and 5.x and vLLM read it); NTK
    is a larger base (base * factor^(d/(d-2))), exact for any reader."""
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
    if scaling.type == "longrope":
        raise CheckpointError("cannot export rope scaling 'longrope' but as phi3 (Llama's block, no qk-norm or biases)")
    raise CheckpointError(f"cannot export rope scaling type {scaling.type!r}")
