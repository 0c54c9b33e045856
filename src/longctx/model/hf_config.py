"""config.json <-> ModelConfig through the model-family registry (model/families/).

Import reads the `model_type`s of `MODEL_TYPES` (llama, mistral without an effective sliding
window, qwen2 without sliding layers, qwen3, ...); each family refuses, naming the field,
whatever would make the logits differ (another activation, MLP biases, soft-capping, ...),
since the weights would load and the outputs silently differ. Export writes `llama`, `qwen2`
(q/k/v-only biases: Llama's `attention_bias` puts a bias on o_proj too) `qwen3`
(per-head qk-norm), `smollm3` (NoPE layers), `olmo2` (post-norm blocks), `olmo3` (post-norm
blocks with sliding layers), `phi3` (partial or longrope RoPE, a window on every layer; fused
weights), `gemma3_text` (Gemma 3's block, sliding layers, RoPE per layer type),
`olmo_hybrid` (linear layers of its variant, OLMo 3's full layers, NoPE or rotating) or a dense
`qwen3_next` (linear layers of its variant, gated attention, partial RoPE, 1 + w norms), with
`tie_word_embeddings` as the model has it.

RoPE scaling is written in the `rope_theta` + `rope_scaling` form that transformers 4.x,
5.x and vLLM all read. HF has no static NTK-aware type; NTK scaling *is* a larger base
(base * factor^(d/(d-2))), so it is exported as that `rope_theta`, exact for any reader.
The original settings are kept under `longctx_rope_scaling` so import restores them.
"""

from __future__ import annotations

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families import MODEL_TYPES, family_for, family_for_export

CONFIG_FILE = "config.json"
__all__ = ["CONFIG_FILE", "MODEL_TYPES", "hf_config", "model_config_from_hf"]


def hf_config(config: ModelConfig) -> dict:
    """The config.json of `config` in the family that carries it (family_for_export)."""
    family = family_for_export(config)
    if family.write is None:
        raise CheckpointError(
            f"export-hf does not write {family.model_type} models (model.norm_placement={config.norm_placement!r}, "
            f"model.norm_offset={config.norm_offset}): evaluate the checkpoint with longctx itself"
        )
    gate = config.attention_gate if family.model_type == "qwen3_next" else "none"  # Qwen3-Next's write checks it
    for key, value, plain in (
        ("attention_sinks", config.attention_sinks, False),
        ("attention_gate", config.attention_gate, gate),
        ("attn_temperature.type", config.attn_temperature.type, "none"),
    ):
        if value != plain:
            raise CheckpointError(
                f"cannot export model.{key}={value!r}: no config.json family longctx writes has it "
                "(evaluate the checkpoint with longctx itself)"
            )
    return family.write(config)


def model_config_from_hf(hf: dict, source: str = CONFIG_FILE) -> ModelConfig:
    """Map an HF config.json dict to a ModelConfig by its family, refusing what the model
    cannot represent, with the field named."""
    return family_for(hf.get("model_type"), source).read(hf, source)
