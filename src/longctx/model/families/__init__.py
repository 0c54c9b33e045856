"""The model-family registry (docs/design.md §14): one module per Hugging Face `model_type`,
each a `Family` (families/common.py) saying how its config.json maps onto ModelConfig, its
weight names, what is refused and why, and whether export writes it. `import_hf` and
`export-hf` (model/hf.py, model/hf_config.py) read it; `convert-gguf` writes llama and gemma3 GGUFs.

    family = family_for(hf["model_type"], "config.json")   # or a one-line CheckpointError
    config = family.read(hf, "config.json");  family.hf_name("blocks.0.attn.wq.weight")
    family_for_export(config).write(config)                 # config.json of the family it fits
"""

from __future__ import annotations

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import Family
from longctx.model.families.gemma3 import GEMMA3_TEXT
from longctx.model.families.llama import LLAMA, MISTRAL, QWEN2
from longctx.model.families.olmo2 import OLMO2
from longctx.model.families.olmo3 import OLMO3
from longctx.model.families.olmo_hybrid import OLMO_HYBRID
from longctx.model.families.phi3 import PHI3
from longctx.model.families.phi3 import exports as phi3_exports
from longctx.model.families.qwen3 import QWEN3
from longctx.model.families.qwen3_next import QWEN3_NEXT
from longctx.model.families.smollm3 import SMOLLM3

FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (LLAMA, MISTRAL, QWEN2, QWEN3, SMOLLM3, GEMMA3_TEXT, OLMO2, OLMO3, PHI3, OLMO_HYBRID, QWEN3_NEXT)
}

REFUSED_TYPES = {
    "gpt_oss": "a mixture of experts (longctx's model has one dense MLP per layer; longctx.hf_attention runs it "
    "with longctx_rope)",
    "qwen3_moe": "a mixture of experts (longctx's model has one dense MLP per layer)",
    "qwen2_moe": "a mixture of experts (longctx's model has one dense MLP per layer)",
    "mixtral": "a mixture of experts (longctx's model has one dense MLP per layer)",
    "llama4": "a mixture of experts with chunked attention and interleaved RoPE pairs (out of scope)",
    "llama4_text": "a mixture of experts with chunked attention and interleaved RoPE pairs (out of scope)",
    "gemma3": "a vision-language model: import its text model (model_type gemma3_text)",
    "gemma2": "attention and final logit soft-capping (not reproduced)",
}
"""model_types refused by name, with why (anything else: not a known family)."""

MODEL_TYPES = tuple(FAMILIES)


def family_for(model_type: object, source: str) -> Family:
    """The family of a config.json's `model_type`, or a one-line refusal naming why."""
    if isinstance(model_type, str) and model_type in REFUSED_TYPES:
        raise CheckpointError(f"{source}: model_type {model_type!r} is not supported: {REFUSED_TYPES[model_type]}")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{source}: model_type is {model_type!r}, expected one of {MODEL_TYPES}")
    return FAMILIES[str(model_type)]


def family_for_export(config: ModelConfig) -> Family:
    """The family whose config.json carries `config`'s designs: olmo_hybrid or qwen3_next
    for linear layers (by `linear_attention.variant`), gemma3_text for sandwich or offset norms, olmo2 for post-norm blocks (olmo3 with sliding layers), qwen3
    for per-head qk-norm, smollm3 for NoPE layers, phi3 for partial (`first`) or longrope
    RoPE or a window on every layer, else llama/qwen2 (each refuses, naming the field, what
    its config.json cannot carry)."""
    if "linear" in config.layer_kinds():
        return OLMO_HYBRID if config.linear_attention.variant == "olmo_hybrid" else QWEN3_NEXT
    if config.norm_placement == "sandwich" or config.norm_offset:
        return GEMMA3_TEXT
    if config.norm_placement == "post":
        return OLMO3 if "sliding" in config.layer_kinds() else OLMO2
    if config.qk_norm == "head" and config.norm_placement == "pre":
        return QWEN3
    if config.nope_indices():
        return SMOLLM3
    if phi3_exports(config):
        return PHI3
    return LLAMA
