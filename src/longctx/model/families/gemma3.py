"""`gemma3_text` (Gemma 3's text model; Gemma 3 270M / 1B, the text tower of 4B+):

- embeddings times sqrt(hidden_size), rounded to the embedding dtype (`scale_embeddings`);
- RMSNorm times 1 + weight, the weights as stored (`norm_offset`), on every norm: the
  four of each block, the final one and the per-head q/k norms (`qk_norm: head`);
- norms before and after each sublayer (`norm_placement: sandwich`): input_layernorm,
  post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm;
- GeGLU with the tanh GELU (`hidden_activation: gelu_pytorch_tanh` -> `mlp_activation: gelu_tanh`);
- scores q.k / sqrt(query_pre_attn_scalar) (`query_pre_attn_scalar`);
- `layer_types` (or, in older files, every `sliding_window_pattern`-th layer full) with the
  window `sliding_window`; RoPE per layer type: transformers 5's `rope_parameters`
  {sliding_attention, full_attention}, or 4.x's `rope_local_base_freq` for the sliding
  layers and `rope_theta` + `rope_scaling` for the full ones.

Refused: a non-null `attn_logit_softcapping` or `final_logit_softcapping` (Gemma 2's
soft-capping, null in Gemma 3), `use_bidirectional_attention`, a scaled RoPE on the sliding
layers. Export writes models of exactly these designs as a Gemma3ForCausalLM (transformers
5's `rope_parameters` per layer type, soft-capping null); anything else of a Gemma block
(another activation, post-norm blocks, NoPE layers, partial RoPE) is refused naming the field.
"""

from __future__ import annotations

from typing import Any

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import (
    LLAMA_LAYER_NAMES,
    NO_SPECIAL_IDS,
    Family,
    common_fields,
    common_hf_config,
    layer_type_rope,
    layer_types_from_hf,
    layer_types_to_hf,
    refuse_fields,
    refuse_true,
)

DEFAULTS = {
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072,
    "rope_theta": 1_000_000.0,
}
"""Gemma3TextConfig's defaults for fields a config.json may omit."""

UNSUPPORTED = {
    "attn_logit_softcapping": "attention logit soft-capping",
    "final_logit_softcapping": "final logit soft-capping",
    "use_bidirectional_attention": "bidirectional attention (causal only)",
}

LAYER_NAMES = {
    **LLAMA_LAYER_NAMES,
    "attn_post_norm.weight": "post_attention_layernorm.weight",
    "mlp_norm.weight": "pre_feedforward_layernorm.weight",
    "mlp_post_norm.weight": "post_feedforward_layernorm.weight",
}


GEMMA_BLOCK: dict[str, Any] = {
    "norm_placement": "sandwich",
    "norm_offset": True,
    "mlp_activation": "gelu_tanh",
    "scale_embeddings": True,
    "qk_norm": "head",
    "rotary_fraction": 1.0,
}
"""ModelConfig's fields at Gemma 3's values: what a Gemma3ForCausalLM computes."""


def read(hf: dict, source: str) -> ModelConfig:
    hf = {**DEFAULTS, **hf}
    refuse_true(hf, source, {key: f"longctx has no {meaning}" for key, meaning in UNSUPPORTED.items()})
    fields = common_fields(hf, source, activations=("gelu_pytorch_tanh",))
    if hf.get("layer_types") is None:
        pattern = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6
        n_layers = hf["num_hidden_layers"]
        hf["layer_types"] = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)
        ]
    layers = layer_types_from_hf(hf, source)
    local_base = layer_type_rope(hf, source, fields)
    if local_base is None:  # transformers 4.x: the sliding layers' own base
        local_base = float(hf.get("rope_local_base_freq", 10000.0))
    return ModelConfig(
        **fields,
        **layers,
        **GEMMA_BLOCK,
        sliding_rope_base=local_base if layers else 0.0,
        query_pre_attn_scalar=float(hf["query_pre_attn_scalar"]),
    )


def write(config: ModelConfig) -> dict:
    """A Gemma3ForCausalLM: sandwich norms with 1 + weight (weights as stored), GeGLU, scaled
    embeddings, per-head qk-norm, q.k / sqrt(query_pre_attn_scalar), `layer_types` with the
    window, RoPE per layer type (full: rope_base + scaling; sliding: sliding_rope_base, unscaled)."""
    refuse_fields(config, "Gemma 3", GEMMA_BLOCK)
    if config.nope_indices():
        raise CheckpointError(
            "cannot export NoPE layers (model.nope_layers / nope_every) as gemma3_text: every Gemma 3 layer rotates"
        )
    values = common_hf_config(
        config, "gemma3_text", "Gemma3ForCausalLM", omit=("rope_theta", "rope_scaling", "hidden_act")
    )
    values.update(
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=_scalar(config.query_pre_attn_scalar or config.head_size),
        **layer_types_to_hf(config),
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        use_bidirectional_attention=False,
        **NO_SPECIAL_IDS,  # Gemma3TextConfig's defaults are Gemma's tokenizer's
    )
    return values


def _scalar(value: float) -> int | float:
    """An integral query_pre_attn_scalar as an int (Gemma3TextConfig validates it as one)."""
    return int(value) if float(value).is_integer() else value


GEMMA3_TEXT = Family(
    "gemma3_text",
    "Gemma3ForCausalLM",
    read,
    layer_names=LAYER_NAMES,
    refused=(
        "attn_logit_softcapping / final_logit_softcapping non-null: longctx has no soft-capping",
        "use_bidirectional_attention=true: causal attention only",
        "hidden_activation other than gelu_pytorch_tanh",
        "rope scaling on the sliding layers: longctx's sliding layers rotate unscaled",
    ),
    write=write,
)
