"""`olmo3`: OLMo 2's block (qk-norm over the whole q and k projections, norms after the
sublayers; families/olmo2.py) with sliding layers: `layer_types` (default: every 4th layer
full, the rest sliding) and the window `sliding_window` (4,096 in OLMo 3 7B / 32B). RoPE per
layer type: transformers 5's `rope_parameters` {full_attention, sliding_attention}, or
4.x's `rope_theta` for both with `rope_scaling` (YaRN in the long-context checkpoints) on the
full layers only, as transformers applies it. Refused: a scaled RoPE on the sliding layers
(longctx's sliding layers rotate unscaled), `mlp_bias`. Export writes post-norm models with
sliding layers as olmo3 (transformers 5's `rope_parameters` per layer type).
"""

from __future__ import annotations

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import (
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
from longctx.model.families.llama import MLP_BIAS, MLP_REFUSED
from longctx.model.families.olmo2 import LAYER_NAMES, OLMO_BLOCK

DEFAULTS = {"rope_theta": 500000.0, "sliding_window": 4096, "max_position_embeddings": 2048}
"""Olmo3Config's defaults for fields a config.json may omit."""


def read(hf: dict, source: str) -> ModelConfig:
    hf = {**DEFAULTS, **hf}
    refuse_true(hf, source, MLP_BIAS)
    fields = common_fields(hf, source)
    if hf.get("layer_types") is None:
        n_layers = hf["num_hidden_layers"]
        hf["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(n_layers)]
    layers = layer_types_from_hf(hf, source)
    local_base = layer_type_rope(hf, source, fields)
    if local_base is None:  # transformers 4.x: `rope_theta` for both, scaled on the full layers only
        local_base = float(hf["rope_theta"])
    return ModelConfig(
        **fields,
        **layers,
        sliding_rope_base=local_base if layers else 0.0,
        **OLMO_BLOCK,
    )


def write(config: ModelConfig) -> dict:
    """An Olmo3ForCausalLM: OLMo 2's block, `layer_types` with the window, RoPE per layer type
    (full: rope_base + scaling; sliding: sliding_rope_base, unscaled)."""
    if config.nope_indices():
        raise CheckpointError(
            "cannot export NoPE layers (model.nope_layers / nope_every) as olmo3: every layer rotates"
        )
    refuse_fields(config, "OLMo 3", OLMO_BLOCK)
    values = common_hf_config(config, "olmo3", "Olmo3ForCausalLM", omit=("rope_theta", "rope_scaling"))
    values.update(
        **layer_types_to_hf(config),
        **NO_SPECIAL_IDS,  # Olmo3Config's default ids are OLMo's tokenizer's
    )
    return values


OLMO3 = Family(
    "olmo3",
    "Olmo3ForCausalLM",
    read,
    layer_names=LAYER_NAMES,
    refused=(*MLP_REFUSED, "rope scaling on the sliding layers: longctx's sliding layers rotate unscaled"),
    write=write,
)
