"""`llama`, `mistral` and `qwen2`: pre-norm SwiGLU decoders, every layer full and rotating.

Read: Llama's `attention_bias` (q/k/v/o), Qwen2's q/k/v biases. Refused: `mlp_bias`
(longctx's MLP has no biases), Mistral's `sliding_window` below the context, Qwen2's
`use_sliding_window` / sliding `layer_types` (longctx maps sliding layers for the families
that ship them: gemma3_text, qwen3, smollm3). Written by export: `llama`, or `qwen2` for
q/k/v-only biases.
"""

from __future__ import annotations

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import Family, common_fields, common_hf_config, refuse_fields, refuse_true

MLP_BIAS = {"mlp_bias": "biases in the MLP projections"}
MLP_REFUSED = ("mlp_bias: longctx's MLP has no biases", "hidden_act other than silu")
"""The `refused` lines of MLP_BIAS and `common_fields`' activation check, for the families of Llama's MLP."""


def read(hf: dict, source: str) -> ModelConfig:
    refuse_true(hf, source, MLP_BIAS)
    refuse_sliding_window(hf, source)
    qwen2 = hf["model_type"] == "qwen2"
    fields = common_fields(hf, source, bias_flag=not qwen2)
    if qwen2:  # q/k/v biases, always
        fields["attention_bias"] = "qkv"
    return ModelConfig(**fields)


def refuse_sliding_window(hf: dict, source: str) -> None:
    """Sliding-window attention changes which keys a query sees; a window at least the
    context (or none) is full attention, which is what these families compute."""
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


def write(config: ModelConfig) -> dict:
    """A LlamaForCausalLM, or a Qwen2ForCausalLM for q/k/v biases."""
    if config.is_hybrid:
        raise CheckpointError(
            "export-hf writes Llama and Qwen2 models, whose every layer is full and rotates: this model has "
            "sliding or NoPE layers (model.layer_types / global_every / nope_layers / nope_every)"
        )
    qwen2 = config.attention_bias == "qkv"
    architecture = "Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"
    refuse_fields(config, "Llama/Qwen2", {"qk_norm": "none", "rotary_fraction": 1})
    refuse_fields(config, architecture, PLAIN_BLOCK)
    values = common_hf_config(config, "qwen2" if qwen2 else "llama", architecture, bias_flag=not qwen2)
    if qwen2:
        values.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.n_layers)
    else:
        values.update(mlp_bias=False)
    return values


PLAIN_BLOCK = {
    "norm_placement": "pre",
    "norm_offset": False,
    "mlp_activation": "silu",
    "scale_embeddings": False,
    "query_pre_attn_scalar": 0.0,
}
"""ModelConfig's Gemma/OLMo block fields at Llama's values: what every non-Gemma, non-OLMo family needs."""

REFUSED = (
    "mlp_bias: longctx's MLP has no biases",
    "hidden_act other than silu: longctx's MLP is SwiGLU",
    "pretraining_tp > 1",
    "rope_scaling types other than linear, yarn (without DeepSeek's mscale), llama3",
)
LLAMA = Family(
    "llama",
    "LlamaForCausalLM",
    read,
    refused=REFUSED,
    write=write,
)
MISTRAL = Family(
    "mistral",
    "MistralForCausalLM",
    read,
    refused=(*REFUSED, "sliding_window < max_position_embeddings: full attention only (v0.2 on: null)"),
)
QWEN2 = Family(
    "qwen2",
    "Qwen2ForCausalLM",
    read,
    refused=(*REFUSED, "use_sliding_window=true or sliding layer_types: full attention only"),
    write=write,
)
