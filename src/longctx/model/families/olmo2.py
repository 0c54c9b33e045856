"""`olmo2`: qk-norm over the whole q and k projections (`qk_norm: projection`, weights of
n_heads x head_dim and n_kv_heads x head_dim, before the split into heads and RoPE) and
norms after the sublayers only (`norm_placement: post`): x + post_attention_layernorm(attn(x)),
then x + post_feedforward_layernorm(mlp(x)). Note the name: OLMo 2's
`post_attention_layernorm` normalises the attention's output, Llama's the MLP's input.
Every layer full. Export writes models of these designs as olmo2.
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
    layer_types_from_hf,
    refuse_fields,
    refuse_hybrid,
    refuse_true,
)
from longctx.model.families.llama import MLP_BIAS, MLP_REFUSED, PLAIN_BLOCK

LAYER_NAMES = {
    **{ours: theirs for ours, theirs in LLAMA_LAYER_NAMES.items() if "norm.weight" not in ours or "attn." in ours},
    "attn_post_norm.weight": "post_attention_layernorm.weight",
    "mlp_post_norm.weight": "post_feedforward_layernorm.weight",
}

OLMO_BLOCK: dict[str, Any] = {**PLAIN_BLOCK, "norm_placement": "post", "qk_norm": "projection", "rotary_fraction": 1.0}
"""ModelConfig's block fields at OLMo 2's values (OLMo 3's and OLMo Hybrid's full layers too)."""


def read(hf: dict, source: str) -> ModelConfig:
    refuse_true(hf, source, MLP_BIAS)
    fields = common_fields(hf, source)
    if layer_types_from_hf(hf, source):
        raise CheckpointError(f"{source}: layer_types with sliding layers is not supported for olmo2 (olmo3 has them)")
    return ModelConfig(
        **fields,
        **OLMO_BLOCK,
    )


def write(config: ModelConfig) -> dict:
    """An Olmo2ForCausalLM: post-norm blocks, qk-norm over the projections, full layers."""
    refuse_hybrid(config, "olmo2")
    refuse_fields(config, "OLMo 2", OLMO_BLOCK)
    values = common_hf_config(config, "olmo2", "Olmo2ForCausalLM")
    # Olmo2Config's default ids (pad 1, eos 50279) are OLMo's tokenizer's.
    values.update(NO_SPECIAL_IDS)
    return values


OLMO2 = Family(
    "olmo2",
    "Olmo2ForCausalLM",
    read,
    layer_names=LAYER_NAMES,
    refused=(*MLP_REFUSED, "sliding layer_types (OLMo 3's design: model_type olmo3)"),
    write=write,
)
